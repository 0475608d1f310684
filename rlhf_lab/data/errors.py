"""Errors of a dataset a job cannot use, as the user sees them: :class:`DataError`, one line (the CLI prints it and
exits 2, like a config error); :func:`data_errors` turns the data layer's errors (:mod:`rlhf_lab.data.preferences`,
:mod:`rlhf_lab.data.external`: bad rows named ``file:line``, an empty or too small dataset, a missing file) into it.
A leaf module."""

from __future__ import annotations

import contextlib
from typing import Iterator


class DataError(ValueError):
    """A dataset a job cannot use (bad rows named ``file:line``, an empty or too small dataset, a missing file);
    ``str(err)`` is one line. The CLI prints it and exits 2, like a config error."""


@contextlib.contextmanager
def data_errors() -> Iterator[None]:
    """Around the reading of ``data=jsonl|hf``: its errors (ValueError, OSError: the data layer's own messages, which
    name the file and line of each bad row) raised again as :class:`DataError`, on one line."""
    try:
        yield
    except DataError:
        raise
    except (ValueError, OSError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise DataError("".join(line + ("" if i == len(lines) - 1 else " " if line.endswith(":") else "; ")
                                for i, line in enumerate(lines))) from err
