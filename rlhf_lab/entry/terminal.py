"""A job's ``run.log`` holds what its terminal showed: :class:`TerminalLog`, a Hydra callback
(``hydra.callbacks.terminal_log`` in conf/config.yaml), copies the job's stdout and stderr into the file Hydra made for
Python's logging only (a job reports through ``print`` and progress bars), from the job's start to its end. A
progress bar redrawn in place (carriage returns) is written once, as it stood when its line ended.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


class LineCopy:
    """Appends the finished lines written to it to the file `path`, each as the terminal shows it at its end (the
    text after its last carriage return)."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8", errors="replace")
        self.pending = ""

    def write(self, text: str) -> None:
        self.pending += text
        if "\n" not in self.pending:
            return
        *lines, self.pending = self.pending.split("\n")
        self.file.write("".join(line.rstrip("\r").rsplit("\r", 1)[-1] + "\n" for line in lines))
        self.file.flush()

    def close(self) -> None:
        if self.pending.strip():
            self.write("\n")
        self.file.close()


class Tee:
    """A text stream that writes to `stream` (the terminal) and to a :class:`LineCopy`; everything else (``fileno``,
    ``isatty``, ``encoding``, ...) is the stream's."""

    def __init__(self, stream: TextIO, copy: LineCopy):
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        try:
            self.copy.write(text)
        except (OSError, ValueError):  # the log file gone or closed: the terminal still gets everything
            pass
        return n

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def job_log_path(config: DictConfig) -> Path:
    """The file Hydra's job logging writes (``hydra.job_logging.handlers.file.filename``), else
    ``<output dir>/<job name>.log``."""
    name = OmegaConf.select(config, "hydra.job_logging.handlers.file.filename", default=None)
    if name:
        return Path(str(name))
    return Path(str(config.hydra.runtime.output_dir)) / f"{config.hydra.job.name}.log"


class TerminalLog(Callback):
    """Copies the job's stdout and stderr (each its own lines) into its ``run.log`` from ``on_job_start`` to
    ``on_job_end``."""

    def __init__(self) -> None:
        self.tees: tuple[Tee, Tee] | None = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            path = job_log_path(config)
            path.parent.mkdir(parents=True, exist_ok=True)
            copies = LineCopy(path), LineCopy(path)
        except (OSError, ValueError):  # no log file to write: the job runs as before
            return
        self.tees = Tee(sys.stdout, copies[0]), Tee(sys.stderr, copies[1])
        sys.stdout, sys.stderr = self.tees

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if self.tees is None:
            return
        out, err = self.tees
        if sys.stdout is out:  # put back unless someone replaced it since
            sys.stdout = out.stream
        if sys.stderr is err:
            sys.stderr = err.stream
        for tee in self.tees:
            tee.copy.close()
        self.tees = None
