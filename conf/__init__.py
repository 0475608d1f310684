"""The Hydra config groups of rlhf-lab (installed as package rlhf_lab.conf); importing it registers
the structured-config schemas the YAML files inherit (rlhf_lab/config/schema.py)."""

from rlhf_lab.config.schema import register

register()
