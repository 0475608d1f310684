"""``hydra/sweeper=optuna``'s sweeper (:mod:`rlhf_lab.config.sweeper`). Hydra instantiates a sweeper only from a class
its plugin scan found in the ``hydra_plugins`` package; the code is :class:`rlhf_lab.entry.tune.OptunaSweeper`'s."""

from rlhf_lab.entry.tune import OptunaSweeper as LabOptunaSweeper


class OptunaSweeper(LabOptunaSweeper):
    """:class:`rlhf_lab.entry.tune.OptunaSweeper`, where Hydra looks for sweepers."""
