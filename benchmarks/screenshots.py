"""The docs' screenshots of the MLflow UI (``docs/img/mlflow_*.png``) from a real sweep, taken by headless Chromium.

    python -m benchmarks.screenshots                 # runs the README's 3-minute β sweep in a temporary folder
    python -m benchmarks.screenshots --store DIR     # a folder where a sweep already ran (its mlflow.db)

The sweep is ``rlhf-lab -m sweep=ppo_beta_grid +ppo_kl=fixed_0,fixed_0.1 trainer.max_steps=50`` (two PPO jobs); then
``mlflow server`` serves its store on a free loopback port and Chromium (Debian's ``chromium``: ``apt-get install -y
chromium``) shoots the runs list, one job's run page with its ``proxy_vs_gold.png``, the sweep's parent run (its
description: the study table) and the parent's study figure. The functions that serve the UI and read a page are
also what tests/test_mlflow_ui.py uses to check the UI shows the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from rlhf_lab.runs.tracking import ui_link

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["sweep=ppo_beta_grid", "+ppo_kl=fixed_0,fixed_0.1", "trainer.max_steps=50"]  # README: the 3-minute sweep
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    """The headless browser on PATH, or None."""
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(store_uri: str, timeout: float = 180.0) -> Iterator[str]:
    """``mlflow server`` (one worker) on the store `store_uri` at a free loopback port, until the block ends: yields
    its base URL once it answers; its log is in a temporary file, named in the error if it never answers."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="rlhf_lab_mlflow_ui_", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri, "--host",
                             "127.0.0.1", "--port", str(port), "--workers", "1"], stdout=log, stderr=log,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"mlflow server did not answer at {base} within {timeout:.0f} s (log: {log.name})")
            time.sleep(1)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its job workers linger: nothing of a read-only UI is lost
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        os.unlink(log.name)


def page_url(base: str, experiment_id: str, run_id: str | None = None, tab: str = "", view: str | None = None) -> str:
    """A page of the UI in its model-training view (:func:`rlhf_lab.runs.tracking.ui_link`): the runs list (with the
    saved `view`), a run's overview, or one of its tabs (``artifacts/<path>`` opens that artifact)."""
    return ui_link(base, experiment_id, f"{run_id}/{tab}".rstrip("/") if run_id else None, view)


def chromium_args(budget_ms: int) -> list[str]:
    browser = chromium()
    if browser is None:
        raise RuntimeError("no headless Chromium on PATH: apt-get install -y chromium")
    # --no-sandbox: Chromium refuses to run as root with its sandbox (CI runs as root)
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--virtual-time-budget={budget_ms}"]


def page_dom(url: str, budget_ms: int = 20000) -> str:
    """The page's DOM after its scripts ran (`budget_ms` of virtual time: the UI's requests answered)."""
    r = subprocess.run([*chromium_args(budget_ms), "--dump-dom", url], capture_output=True, text=True, timeout=120)
    return r.stdout


def screenshot(url: str, path: Path, size: tuple[int, int] = (1400, 900), budget_ms: int = 20000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*chromium_args(budget_ms), f"--window-size={size[0]},{size[1]}", f"--screenshot={path}", url],
                   capture_output=True, timeout=120, check=True)
    from PIL import Image  # matplotlib's dependency

    with Image.open(path) as shot:  # 128 colours: a third of the bytes, the UI's text as sharp
        small = shot.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
    return path


def shown_image(dom: str, artifact: str) -> bool:
    """Whether the UI's artifact viewer shows the image `artifact` (a path in the run's artifacts): an ``<img>``
    named after it whose source is the file the page downloaded (a ``blob:`` URL)."""
    return re.search(rf'<img alt="{re.escape(artifact)}" src="blob:', dom) is not None


def sweep_runs(store_uri: str) -> tuple[str, object, list]:
    """(experiment id, the last sweep's parent run, its job runs) in the store."""
    from mlflow import MlflowClient

    from rlhf_lab.runs.tracking import JOB_TAG

    client = MlflowClient(store_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "", max_results=1000,
                              order_by=["attributes.start_time DESC"])
    parent = next(r for r in runs if r.data.tags.get("rlhf_lab.stage") == "sweep")
    jobs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
            and r.data.tags.get(JOB_TAG) == "true"]
    return parent.info.experiment_id, parent, sorted(jobs, key=lambda r: r.info.run_name)


def shoot(store_uri: str, out: Path) -> list[Path]:
    """The four screenshots of the last sweep in `store_uri`, written into `out` (the job's figure: the first job by
    name, β = 0 in the README's sweep, where the proxy rises and the gold falls)."""
    from rlhf_lab.analysis.parent_run import STUDY_FIGURE
    from rlhf_lab.analysis.run_figure import FIGURE

    from mlflow import MlflowClient

    from rlhf_lab.runs.tracking import HEADLINE_VIEW, HEADLINE_VIEW_TAG

    exp, parent, jobs = sweep_runs(store_uri)
    view = HEADLINE_VIEW if HEADLINE_VIEW_TAG in MlflowClient(store_uri).get_experiment(exp).tags else None
    with mlflow_ui(store_uri) as base:
        pid = parent.info.run_id
        return [screenshot(page_url(base, exp, view=view), out / "mlflow_runs.png", size=(1400, 500)),
                screenshot(page_url(base, exp, jobs[0].info.run_id, f"artifacts/{FIGURE}"), out / "mlflow_run_figure.png",
                           size=(1400, 560)),
                screenshot(page_url(base, exp, pid), out / "mlflow_parent.png", size=(1400, 1300)),
                screenshot(page_url(base, exp, pid, f"artifacts/{STUDY_FIGURE}"), out / "mlflow_study_figure.png",
                           size=(1400, 700))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.screenshots", description=__doc__.splitlines()[0])
    p.add_argument("--store", type=Path, help="a folder where a sweep ran (its mlflow.db); default: run the sweep")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = p.parse_args(argv)
    folder = args.store or Path(tempfile.mkdtemp(prefix="rlhf_lab_screenshots_"))
    if args.store is None:
        print(f"running rlhf-lab -m {' '.join(SWEEP)} in {folder}", flush=True)
        subprocess.run([sys.executable, "-m", "rlhf_lab.entry.run", "-m", *SWEEP], cwd=folder, check=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    for path in shoot(f"sqlite:///{(folder / 'mlflow.db').resolve()}", args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
