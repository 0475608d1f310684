"""The Hydra config groups of rlhf-lab (installed as package rlhf_lab.conf); importing it registers
the structured-config schemas the YAML files inherit (rlhf_lab/config/schema.py) and the points of the
``frontier`` and ``frontier_equal`` groups, ``+frontier=<algo>_<β>`` (rlhf_lab/config/frontier.py, from the files
of conf/frontier/ and conf/frontier_equal/)."""

from importlib.resources import files

from rlhf_lab.config import frontier
from rlhf_lab.config.schema import register

register()
frontier.register(files(__name__).joinpath("frontier"), "frontier")
frontier.register(files(__name__).joinpath("frontier_equal"), "frontier_equal")
