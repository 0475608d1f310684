"""Policy evaluation on held-out prompts, the sample statistics every algorithm logs, and the Lightning callbacks that
run them."""
