"""What MLflow shows of a result: each policy run's figure of proxy and gold reward (rlhf_lab/analysis/run_figure.py)
and a sweep parent run's description with the study's table (rlhf_lab/analysis/parent_run.py)."""

from __future__ import annotations

import mlflow

from rlhf_lab.analysis import parent_run
from rlhf_lab.analysis.plots import plot_run_rewards
from rlhf_lab.analysis.run_figure import FIGURE, log_run_figure
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab.analysis.run_figure import log_job_figure

PNG = b"\x89PNG\r\n\x1a\n"


def _run(stage: str = "ppo", **history) -> RunData:
    return RunData("r1", stage, "FINISHED", {}, {}, {}, history={k.replace("__", "/"): v for k, v in history.items()})


CURVE = {"eval__gold_reward": [(0, 0.1), (5, 0.3), (10, 0.2)], "eval__proxy_reward": [(0, 0.0), (5, 1.0), (10, 2.0)],
         "eval__kl": [(0, 0.0), (5, 1.0), (10, 4.0)]}


def test_a_run_figure_draws_gold_and_proxy_and_a_gold_free_run_only_proxy(tmp_path):
    assert plot_run_rewards(_run(**CURVE), tmp_path / "a.png") == ["eval/gold_reward", "eval/proxy_reward"]
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG
    no_gold = {k: v for k, v in CURVE.items() if "gold" not in k}  # external data without gold.path
    assert plot_run_rewards(_run(**no_gold), tmp_path / "b.png") == ["eval/proxy_reward"]
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG
    bon = {"bon__gold_reward": [(1, 0.1), (4, 0.2)], "bon__proxy_reward": [(1, 0.0), (4, 1.0)],
           "bon__kl": [(1, 0.0), (4, 0.64)]}  # best-of-n: its bon/* curve, n as the step
    assert plot_run_rewards(_run("bon", **bon), tmp_path / "c.png") == ["eval/gold_reward", "eval/proxy_reward"]
    assert plot_run_rewards(_run(eval__kl=CURVE["eval__kl"]), tmp_path / "d.png") == []
    assert not (tmp_path / "d.png").exists()


def test_a_policy_job_logs_its_figure_into_its_run_and_other_stages_none(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("t")
    ids = {}
    for stage in ("dpo", "sft"):
        ids[stage] = client.create_run(exp, tags={"rlhf_lab.stage": stage}).info.run_id
        for key, points in CURVE.items():
            for step, value in points:
                client.log_metric(ids[stage], key.replace("__", "/"), value, step=step)
    log_job_figure("dpo", uri, ids["dpo"])
    log_job_figure("sft", uri, ids["sft"])
    assert [a.path for a in client.list_artifacts(ids["dpo"])] == [FIGURE]
    assert open(client.download_artifacts(ids["dpo"], FIGURE, str(tmp_path)), "rb").read()[:8] == PNG
    assert client.list_artifacts(ids["sft"]) == []
    assert log_run_figure(client, client.create_run(exp).info.run_id) == []  # nothing logged: no figure


def test_the_parent_runs_description_holds_the_study_table_and_names_the_figures():
    runs = [_run(**CURVE), RunData("r2", "ppo", "FAILED", {}, {}, {})]
    text = parent_run.description("Study `s`: best ...", runs, ["README.md", "gold_vs_sqrt_kl.png"])
    lines = text.splitlines()
    assert lines[0] == "Study `s`: best ..." and lines[2] == "| " + " | ".join(parent_run.NOTE_COLUMNS) + " |"
    assert sum(line.startswith("| `") for line in lines) == 1  # one finished setting; the failed run is not a row
    assert f"`{parent_run.STUDY_FIGURE}`" in text and f"`{FIGURE}`" in text
    assert parent_run.description("n", runs[1:], []) == "n"  # nothing finished: no table
    many = [RunData(f"r{i}", "ppo", "FINISHED", {}, {}, {}, setting={"kl.beta": str(i)}) for i in range(200)]
    short = parent_run.description("n", many, ["gold_vs_sqrt_kl.png"])  # past MLflow's 8000 characters: no table
    assert len(short) <= parent_run.NOTE_LIMIT and "| setting" not in short and parent_run.STUDY_FIGURE in short
