"""The Hydra config groups of rlhf-lab (installed as package rlhf_lab.conf); importing it registers
the structured-config schemas the YAML files inherit (rlhf_lab/config/schema.py) and the points of the
``frontier`` and ``frontier_equal`` groups, ``+frontier=<algo>_<β>`` (rlhf_lab/config/frontier.py, from the files
of conf/frontier/ and conf/frontier_equal/). It also makes Hydra's copies of its config repository share the
ConfigStore instead of copying it at every composition (rlhf_lab/config/live_store.py), and stores the lab's
``hydra/sweeper=optuna`` over the Optuna plugin's (rlhf_lab/config/sweeper.py) and registers its sweeper class with
Hydra's plugins (hydra_plugins/rlhf_lab_tune/)."""

from importlib.resources import files

from hydra.core.plugins import Plugins
from hydra_plugins.rlhf_lab_tune.sweeper import OptunaSweeper

from rlhf_lab.config import cli_help, frontier, live_store, sweeper
from rlhf_lab.config.schema import register

live_store.share()
register()
sweeper.register()  # after Hydra's plugin scan: hydra/sweeper=optuna is the lab's (rlhf_lab/entry/tune.py)
# its class, which the scan finds only where hydra_plugins/ is a folder on the path (not in an editable install)
Plugins.instance().register(OptunaSweeper)
cli_help.register()  # the resolvers of `rlhf-lab --help` (conf/hydra/help/rlhf_lab.yaml)
frontier.register(files(__name__).joinpath("frontier"), "frontier")
frontier.register(files(__name__).joinpath("frontier_equal"), "frontier_equal")
