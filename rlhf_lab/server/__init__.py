"""The team tracking server's parts (``rlhf-lab-server``, :mod:`rlhf_lab.entry.server`): its folder and secrets,
its PostgreSQL cluster, MLflow's users."""
