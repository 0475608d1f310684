"""Analysis of finished runs: statistics and verdicts on RLHF claims."""
