"""The errors of a bad config value, as the user sees them: :class:`ConfigError` (one line naming the key, the value
given and what is allowed) and :class:`UnknownKey` (a key the config does not have, with the closest one). The CLI
prints either on one line and exits 2 (:func:`rlhf_lab.config.checks.exit_on_bad_config`). A leaf module:
:mod:`rlhf_lab.config.checks` raises them; every other module imports them from here."""

from __future__ import annotations

import difflib
from typing import Any, Iterable


class ConfigError(ValueError):
    """A config value outside what is allowed; ``str(err)`` is one line naming the key."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key} must be {allowed}, got {value!r}")


class UnknownKey(ConfigError):
    """A key the config does not have (a typo, or ``+key=value`` outside the config groups); names the closest key."""

    def __init__(self, key: str, given: str, candidates: Iterable[str]) -> None:
        self.key, self.value, self.allowed = key, given, "a key of the config"
        near = closest_key(key, candidates)
        hint = f"did you mean {near}?" if near else "rlhf-lab --cfg job lists the keys"
        ValueError.__init__(self, f"unknown key {key}" + (f" (in {given})" if given != key else "") + f"; {hint}")


def closest_key(key: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like `key` (difflib's ratio ≥ 0.6), or None."""
    near = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return near[0] if near else None
