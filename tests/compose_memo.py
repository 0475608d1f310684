"""Hydra's compose API, each composition made once per test process (the test run's speed, nothing else).

A composition costs about 0.2 s of CPU (Hydra reads ~20 YAML files, builds the defaults tree and merges). The
tests compose the same job many times: `rlhf_lab.entry.sweeps.plan` composes a study's settings, then the test that
checks an arm composes it again, and the next test of the file the same study; a quarter of the tests'
compositions, about 50 s of CPU in a run, repeated one made earlier in the same worker. `install()` replaces
`hydra.compose` (what `from hydra import compose` finds, in the tests and in the library) by a function that
composes for real the first time and afterwards returns a deep copy of that result, for the same config name,
overrides, `return_hydra_config` and search path. Only compositions whose search path is made of package
(``pkg://``) and structured (``structured://``) sources are kept: the files a test writes (a user's own config
folder) are composed every time. A composition that fails is not kept, so it fails again.
"""

from __future__ import annotations

import copy

import hydra
from hydra.core.global_hydra import GlobalHydra

_KEPT: dict = {}


def install() -> None:
    real = getattr(hydra.compose, "real", hydra.compose)

    def compose(config_name=None, overrides=None, return_hydra_config=False, strict=None):
        loader = GlobalHydra.instance().hydra.config_loader if GlobalHydra.instance().is_initialized() else None
        sources = tuple((s.scheme(), s.path) for s in loader.get_sources()) if loader else (("none", ""),)
        if strict is not None or any(scheme not in ("pkg", "structured") for scheme, _ in sources):
            return real(config_name, overrides, return_hydra_config, strict)
        key = (config_name, tuple(overrides or ()), return_hydra_config, sources)
        if key not in _KEPT:
            _KEPT[key] = real(config_name, list(overrides or ()), return_hydra_config)
        return copy.deepcopy(_KEPT[key])

    compose.real = real
    hydra.compose = compose
