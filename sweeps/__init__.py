"""Canned studies (Hydra config group ``sweep``), shipped in the wheel as ``rlhf_lab.sweeps``.

``conf/config.yaml`` puts ``pkg://rlhf_lab.sweeps`` on Hydra's search path, so that
``rlhf-lab -m sweep=<study>`` finds ``sweeps/sweep/<study>.yaml`` from an editable and a regular install.
"""
