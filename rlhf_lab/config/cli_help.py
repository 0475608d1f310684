"""What ``rlhf-lab --help`` lists: the config groups a user chooses from and the canned sweeps.

Hydra's ``$APP_CONFIG_GROUPS`` lists every group of the config repository, the internal ones included (``schema/*``:
the typed schemas the YAML files inherit; ``frontier`` and ``frontier_equal``: the points the algorithm-frontier
sweeps compose), and no sweep (the ``sweep`` group comes from the primary config's search path, which the help's
listing does not read). The help template (conf/hydra/help/rlhf_lab.yaml) uses the resolvers registered here
instead: ``${rlhf_lab.help_groups:}`` (:func:`help_groups`) and ``${rlhf_lab.help_sweeps:}`` (:func:`help_sweeps`).
"""

from __future__ import annotations

import textwrap
from importlib.resources import files

from omegaconf import OmegaConf

HIDDEN_GROUPS = ("hydra", "schema", "frontier", "frontier_equal")  # internal: never chosen on the command line
SWEEPS, ARCHIVE = "rlhf_lab.sweeps", "rlhf_lab.sweeps.archive"  # sweeps/sweep/*.yaml, sweeps/archive/sweep/*.yaml
WIDTH = 118


def wrapped(head: str, items: list[str]) -> str:
    return textwrap.fill(", ".join(items), width=WIDTH, initial_indent=head, subsequent_indent="  ",
                         break_on_hyphens=False)


def help_groups() -> str:
    """``group: option, option, ...`` for each group a user chooses from, as Hydra lists them, without the hidden
    ones."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    loader = GlobalHydra.instance().config_loader()
    groups: list[str] = []

    def walk(parent: str) -> None:
        for g in loader.list_groups(parent):
            name = f"{parent}/{g}" if parent else g
            if name.split("/")[0] in HIDDEN_GROUPS:
                continue
            if loader.get_group_options(name, ObjectType.CONFIG):
                groups.append(name)
            walk(name)

    walk("")
    return "\n".join(wrapped(f"{g}: ", sorted(loader.get_group_options(g))) for g in sorted(groups))


def sweep_names(package: str = SWEEPS) -> list[str]:
    """The sweeps (``sweep=NAME``) a package of studies ships: the YAML files of its ``sweep/`` folder."""
    folder = files(package).joinpath("sweep")
    if not folder.is_dir():
        return []
    return sorted(f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml"))


def help_sweeps() -> str:
    """The canned sweeps, then the superseded ones (still composable with ``sweep=NAME``), comma-separated and
    wrapped."""
    current = sweep_names(SWEEPS)
    archived = [n for n in sweep_names(ARCHIVE) if n not in current]
    text = wrapped("", current)
    return text + ("\n" + wrapped("superseded (sweeps/archive/): ", archived) if archived else "")


def register() -> None:
    """The two resolvers of the help template (replacing earlier registrations: idempotent)."""
    OmegaConf.register_new_resolver("rlhf_lab.help_groups", help_groups, replace=True)
    OmegaConf.register_new_resolver("rlhf_lab.help_sweeps", help_sweeps, replace=True)
