"""The README's install resolves with the newest pip: in a scratch virtual environment (outside the repository)
with pip upgraded and torch already satisfied, ``pip install --dry-run --report`` of ``.[dev]`` resolves without
backtracking and every package comes as a wheel (nothing built from source but the one sdist-only release
hydra-core accepts). Skipped when no package index can be reached."""

from __future__ import annotations

import json
import re
import subprocess
import venv
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# antlr4-python3-runtime 4.9.3 (omegaconf/hydra-core pin 4.9.*) was only ever published as a pure-Python sdist
SDIST_ONLY = {"antlr4-python3-runtime"}
BACKTRACKING = re.compile(r"looking at multiple versions|backtracking|taking longer than usual", re.I)
BUILDING = re.compile(r"Building wheel for|Running setup\.py install", re.I)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def satisfy_torch(env: Path) -> None:
    """Make the scratch environment see this environment's torch as installed (a ``.pth`` to a folder that links
    only torch and its metadata), as ``.ci/run``'s ``pip install torch==...`` does; its dependencies stay unmet,
    so pip resolves them too."""
    dist = metadata.distribution("torch")
    site = Path(dist.locate_file(""))
    shelf = env / "torch_only"
    shelf.mkdir()
    for path in [site / "torch", site / "functorch", site / "torchgen", *site.glob(f"torch-{dist.version}.dist-info")]:
        if path.exists():
            (shelf / path.name).symlink_to(path)
    purelib = subprocess.run([str(env / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "torch_only.pth").write_text(str(shelf) + "\n")


def non_wheels(report: dict) -> list[str]:
    """``name url`` of each package the report would install from anything but a wheel, the project itself (a
    local folder) and :data:`SDIST_ONLY` left out."""
    out = []
    for item in report["install"]:
        info, name = item["download_info"], item["metadata"]["name"].lower()
        if "dir_info" in info or name in SDIST_ONLY:
            continue
        if not info["url"].split("#")[0].endswith(".whl"):
            out.append(f"{name} {info['url']}")
    return out


def test_non_wheels_reads_the_report():
    report = {"install": [
        {"download_info": {"url": "file:///repo", "dir_info": {"editable": True}}, "metadata": {"name": "rlhf-lab"}},
        {"download_info": {"url": "https://x/joblib-1.5.3-py3-none-any.whl", "archive_info": {}},
         "metadata": {"name": "joblib"}},
        {"download_info": {"url": "https://x/antlr4-python3-runtime-4.9.3.tar.gz"},
         "metadata": {"name": "antlr4-python3-runtime"}},
        {"download_info": {"url": "https://x/scikit-learn-0.24.2.tar.gz"}, "metadata": {"name": "scikit-learn"}}]}
    assert non_wheels(report) == ["scikit-learn https://x/scikit-learn-0.24.2.tar.gz"]
    assert BACKTRACKING.search("INFO: pip is looking at multiple versions of scikit-learn to determine which")
    assert not BACKTRACKING.search("Collecting joblib<1.6 (from rlhf-lab==0.1.0)")


@pytest.mark.slow
def test_dev_install_resolves_with_the_newest_pip_without_backtracking(tmp_path):
    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env)
    py = str(env / "bin" / "python")
    up = run([py, "-m", "pip", "install", "-q", "-U", "pip"], tmp_path)
    if up.returncode != 0:
        pytest.skip(f"no package index reachable (pip install -U pip: {(up.stderr.strip().splitlines() or [''])[-1]})")
    satisfy_torch(env)
    report = tmp_path / "report.json"
    res = run([py, "-m", "pip", "install", "--dry-run", "--report", str(report), "-e", f"{ROOT}[dev]"], tmp_path)
    out = res.stdout + res.stderr
    version = run([py, "-m", "pip", "--version"], tmp_path).stdout.split()[1]
    assert res.returncode == 0, f"pip {version} could not resolve .[dev]:\n{out[-3000:]}"
    assert not [ln for ln in out.splitlines() if BACKTRACKING.search(ln)], f"pip {version} backtracked:\n{out[-3000:]}"
    built = [ln for ln in out.splitlines() if BUILDING.search(ln)]
    assert not built, f"pip {version} built from source:\n{out[-3000:]}"
    resolved = json.loads(report.read_text())
    assert non_wheels(resolved) == []
    names = {i["metadata"]["name"].lower() for i in resolved["install"]}
    assert {"rlhf-lab", "hydra-ray-launcher", "joblib", "mlflow", "pytest"} <= names and "torch" not in names
