"""`python -m rlhf_lab.entry.run …` as a real process, without paying its imports again: forked from a warm interpreter.

A test that needs the CLI as a process of its own (an exit status, a signal sent to a pid, output on the file
descriptors, four jobs started at once) used to start `python -m rlhf_lab.entry.run`, which spends about 10 s of CPU
importing torch, Lightning (which pulls in torch._dynamo, torchmetrics, scipy.signal and transformers) and MLflow
before it reads its first argument. On 2 cores, some 50 such starts were a quarter of the test run.

`start(args, cwd=…, env=…)` forks the job instead from a `multiprocessing` fork server that imported those
libraries once per test worker and has run nothing since (no torch thread pool is started before the fork). The
child sets its environment, working directory and file descriptors 1 and 2 (files the handle reads back), then
runs the module as `python -m` does (`runpy.run_module(..., alter_sys=True)`: `__main__`, `sys.argv[0]`, the
same code path), runs the `atexit` handlers a normal interpreter exit runs, and exits with the job's status. A
signal sent to `handle.pid` reaches the job itself, so `128 + signal` exit codes and KILLED runs are tested as
they happen for a user.

What this does not cover, and where the real `python -m rlhf_lab.entry.run` is still started: the start-up of a fresh
interpreter (tests/test_cli.py's job and wheel tests), the joblib (`hydra/launcher=parallel`) sweeps, whose loky
workers hang when started from a forked child, and the second DDP rank, which Lightning starts itself.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlhf_lab.runs.code import code_digests
from rlhf_lab.stages.pipeline import STAGES
from tests import mlflow_template

# what a job imports (not rlhf_lab.entry.run itself, which runpy runs as __main__ as `python -m` does): the libraries,
# MLflow's SQL store (imported when a job first opens its store: 1 s of CPU a job), the stage modules (imported when a
# job runs its stage) and the configs' package
PRELOAD = ["torch", "lightning", "transformers", "mlflow", "hydra", "mlflow.store.tracking.sqlalchemy_store",
           "alembic.command", "alembic.runtime.migration", "rlhf_lab.config.checks",
           "rlhf_lab.runs.states", "rlhf_lab.runs.process", "rlhf_lab.entry.sweeps", "rlhf_lab.stages",
           *(f"rlhf_lab.stages.{stage}" for stage in STAGES), "rlhf_lab.evaluation.callbacks", "rlhf_lab.algorithms",
           "rlhf_lab.conf", "tests.cli_process"]

# the digests of the package's code (rlhf_lab.runs.code: 0.6 s of CPU parsing every module), which each job computes
# before it first touches the artifact cache: once here, so that the fork server's children inherit them (no test
# edits the package's files; the tests of a changed digest patch the function in their own process)
code_digests()
mlflow_template.install()  # a job's fresh sqlite store is a copy of one MLflow migrated (tests/mlflow_template.py)

_CONTEXT: list = []


def _context():
    if not _CONTEXT:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _CONTEXT.append(ctx)
    return _CONTEXT[0]


def _child(module: str, args: list[str], cwd: str, env: dict, out: str, err: str) -> None:
    """In the forked process: the job as `python -m module *args` would run it, then exit with its status."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # as the interpreter does: the traceback on stderr, status 1
        import traceback

        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class CliProcess:
    """The part of `subprocess.Popen` the tests use: pid, poll, send_signal, kill, wait, communicate, returncode."""

    def __init__(self, args: list[str], cwd, env: dict | None, module: str = "rlhf_lab.entry.run"):
        self.args = [sys.executable, "-m", module, *map(str, args)]
        self._dir = tempfile.mkdtemp(prefix="cli_process_")
        self._out, self._err = os.path.join(self._dir, "stdout"), os.path.join(self._dir, "stderr")
        env = dict(os.environ if env is None else env)
        self._proc = _context().Process(target=_child, args=(module, list(map(str, args)), str(cwd), env, self._out,
                                                             self._err), daemon=False)
        self._proc.start()
        self.pid = self._proc.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.output()

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) written so far."""
        def read(p):
            try:
                return Path(p).read_text(errors="replace")
            except FileNotFoundError:
                return ""
        return read(self._out), read(self._err)


def start(args: list[str], cwd, env: dict | None = None, module: str = "rlhf_lab.entry.run") -> CliProcess:
    """The CLI started with `args` in `cwd` (environment `env`, default this process's): a running handle."""
    return CliProcess(args, cwd, env, module)


def run(args: list[str], cwd, env: dict | None = None, timeout: float = 300,
        module: str = "rlhf_lab.entry.run") -> subprocess.CompletedProcess:
    """As `subprocess.run([python, -m, module, *args], capture_output=True, text=True)`: killed past `timeout`."""
    p = start(args, cwd, env, module)
    t0 = time.time()
    try:
        out, err = p.communicate(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(30)
        raise subprocess.TimeoutExpired(p.args, time.time() - t0, *p.output())
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)
