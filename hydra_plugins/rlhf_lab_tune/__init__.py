"""The lab's Hydra plugins: Hydra instantiates a sweeper only from the ``hydra_plugins`` package (its plugin scan)."""
