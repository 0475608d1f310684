"""The cache's code digest (rlhf_lab/runs/code.py): an artifact built by other code is never reused, and code a
stage does not run (or a docstring) keeps its keys."""

from __future__ import annotations

from pathlib import Path

from rlhf_lab.runs import cache as cache_mod
from rlhf_lab.runs.cache import ArtifactCache
from rlhf_lab.runs.code import code_text, import_closure, import_graph, stage_code_digest


def test_a_stage_digest_covers_what_the_stage_imports_and_not_what_it_does_not():
    graph = import_graph()
    sft = import_closure("rlhf_lab.stages.sft", graph)
    prefs = import_closure("rlhf_lab.stages.prefs", graph)
    assert "rlhf_lab.models.sampling" in prefs  # the pairs are sampled: a change to sampling rebuilds them
    assert "rlhf_lab.stages.ppo" not in sft and "rlhf_lab.algorithms.ppo" not in sft  # PPO's step keeps the SFT key
    assert not any(m.startswith(("rlhf_lab.analysis", "rlhf_lab.entry")) for m in sft | prefs)
    assert stage_code_digest("sft") != stage_code_digest("ppo")
    assert stage_code_digest("start_eval") is None and stage_code_digest("nope") is None


def test_docstrings_comments_and_layout_do_not_change_the_code_but_a_value_does(tmp_path: Path):
    def text(src: str) -> str:
        f = tmp_path / "m.py"
        f.write_text(src)
        return code_text(f)

    base = text('"""Module."""\n\ndef f(x):\n    """Double."""\n    return 2 * x\n')
    assert text('"""Other words."""\n# a comment\ndef f(x):\n    """Twice x."""\n\n    return 2*x  # why\n') == base
    assert text('"""Module."""\n\ndef f(x):\n    """Double."""\n    return 3 * x\n') != base
    assert text('def f(x):\n    """Only a docstring."""\n') != base  # a body that is only a docstring is `pass`


def test_an_artifact_built_by_other_code_is_built_again_under_its_own_key(tmp_path: Path, monkeypatch):
    c = ArtifactCache(tmp_path)
    builds = []

    def build(tmp: Path):
        builds.append(tmp)
        (tmp / "w.txt").write_text(str(len(builds)))

    monkeypatch.setattr(cache_mod, "stage_code_digest", lambda stage: "code-a")
    a, built_a = c.get_or_build("sft", {"lr": 1}, build)
    assert built_a and c.get_or_build("sft", {"lr": 1}, build) == (a, False)  # same code: reused
    monkeypatch.setattr(cache_mod, "stage_code_digest", lambda stage: "code-b")
    b, built_b = c.get_or_build("sft", {"lr": 1}, build)
    assert built_b and b != a and len(builds) == 2  # other code: a new key, never the old artifact
    assert (b / "w.txt").read_text() == "2" and (a / "w.txt").read_text() == "1"
    # downstream: the upstream path is in the spec, so the RM built on b is another artifact than the one on a
    assert c.path("rm", {"sft": str(a)}) != c.path("rm", {"sft": str(b)})
    monkeypatch.setattr(cache_mod, "stage_code_digest", lambda stage: None)  # not a stage's folder: the spec alone
    assert c.path("start_eval", {"k": 1}) == tmp_path / "start_eval" / cache_mod.artifact_key("start_eval", {"k": 1})
