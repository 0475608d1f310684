"""Superseded study designs (Hydra config group ``sweep``), shipped as ``rlhf_lab.sweeps.archive``: each was replaced
by a newer design in ``sweeps/sweep/`` (sweeps/README.md says by which), and stays composable with the same command
(``rlhf-lab -m sweep=<study>``: conf/config.yaml puts this package on Hydra's search path after the live studies), so
that the runs and commands of earlier reports can be repeated."""
