"""What the MLflow UI shows: run names with the stage and the swept values; a multirun's table of jobs."""

from __future__ import annotations

import mlflow
import pytest

from rlhf_lab.entry import sweeps as sweeping
from rlhf_lab.runs import tracking


def test_run_name_carries_stage_and_swept_values():
    assert tracking.sweep_run_name("ppo", {"sweep.kl.beta": "0.1", "sweep.seed": "1"}) == "ppo kl.beta=0.1 seed=1"
    assert tracking.sweep_run_name("sft", {}) == "sft"


def test_a_job_outside_a_sweep_is_named_by_its_overrides():
    """Issue 68: a seed-3 sft is not named like the quickstart's; paths by their last part; whole overrides only."""
    assert tracking.job_run_name("sft", ["algo=sft", "seed=3", "sft.lr=0.001", "trainer.threads=1",
                                         "tracking.uri=sqlite:///x.db", "cache_dir=/c", "hydra/launcher=parallel",
                                         "skip_finished=true"]) == "sft seed=3 sft.lr=0.001"
    assert tracking.job_run_name("sft", []) == "sft"
    assert tracking.job_run_name("ppo", ["policy.name_or_path=/home/u/models/pythia-70m/", "+ppo_kl=fixed_0.1"]) == (
        "ppo policy.name_or_path=pythia-70m ppo_kl=fixed_0.1")
    many = [f"eval.n_prompts={i}" for i in range(40)]
    name = tracking.job_run_name("ppo", many)
    kept = name.split(" ")[1:-2]
    assert kept == many[:len(kept)] and name.endswith(f" +{40 - len(kept)} more")  # never cut mid-override
    assert len(" ".join(kept)) <= tracking.NAME_CHARS


@pytest.mark.slow
def test_jobs_table_lists_every_job(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("t")
    children = []
    for name, status, gold in (("ppo kl.beta=0.1", "FINISHED", 0.5), ("ppo kl.beta=0", "FAILED", None)):
        run = client.create_run(exp, run_name=name, tags={tracking.JOB_TAG: "true"})
        if gold is not None:
            client.log_metric(run.info.run_id, "eval/gold_reward", gold)
            client.log_metric(run.info.run_id, "test/gold_reward", 0.25)
            client.log_metric(run.info.run_id, "eval/kl", 4.0)
        client.set_terminated(run.info.run_id, status=status)
        children.append(client.get_run(run.info.run_id))
    upstream = client.create_run(exp, run_name="sft")  # an upstream stage built by a job: not a row
    children.append(client.get_run(upstream.info.run_id))
    table = sweeping.jobs_table(children, {"job 2": "kl.beta=5 seed=x", "run abc": "ignored"})
    lines = table.splitlines()
    assert lines[0].split() == ["job", "(run", "name)", "status", "test", "gold", "eval", "gold", "eval", "KL", "time"]
    assert len(lines) == 5 and "sft" not in table
    assert lines[2].split()[:6] == ["ppo", "kl.beta=0.1", "FINISHED", "0.250", "0.500", "4.000"]  # test, eval, KL
    assert "ppo kl.beta=0 " in lines[3] and "FAILED" in lines[3]
    assert lines[4].startswith("job 2 (kl.beta=5 seed=x)") and "FAILED" in lines[4]


def test_ui_link_opens_the_model_training_view():
    """MLflow 3.17's UI shows runs only in its model-training view, chosen by the workflowType query parameter
    (checked in headless Chromium: without it a first visit lands on the GenAI overview, with no runs)."""
    assert tracking.ui_link("http://127.0.0.1:5000/", "3") == (
        "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning")
    assert tracking.ui_link("http://h:1", "3", "abc").endswith("#/experiments/3/runs/abc?workflowType=machine_learning")


def test_the_runs_list_link_names_the_headline_view_every_new_experiment_has(tmp_path):
    """Issue 68: MLflow 3.17's runs list has no default metric columns; a view saved in the experiment's tags (the
    UI's shared views) and named by the link shows the headline metrics as columns (checked in Chromium below)."""
    import json

    assert tracking.ui_link("http://h:1", "3", view="v").endswith("#/experiments/3/runs?workflowType=machine_learning"
                                                                   "&viewStateShareKey=v")
    assert "viewStateShareKey" not in tracking.ui_link("http://h:1", "3", "abc", view="v")  # a run's page: no view
    assert tracking.ui_base("sqlite:///m.db") == "http://127.0.0.1:5000" and tracking.ui_base("file:///x") is None
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tags = mlflow.MlflowClient(uri).get_experiment(tracking.experiment_id(uri, "rlhf-lab")).tags
    assert json.loads(tags[tracking.HEADLINE_VIEW_TAG]) == {"selectedColumns": [
        "metrics.`test/gold_reward`", "metrics.`eval/gold_reward`", "metrics.`eval/proxy_reward`", "metrics.`eval/kl`"]}


def test_ui_hint_per_store():
    assert tracking.ui_hint("http://h:1", "3", "r") == "http://h:1/#/experiments/3/runs/r?workflowType=machine_learning"
    assert tracking.ui_hint("sqlite:///mlflow.db", "3") == (
        "mlflow ui --backend-store-uri sqlite:///mlflow.db, then "
        "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning")
    assert tracking.ui_hint("sqlite:///mlflow.db", None) == "mlflow ui --backend-store-uri sqlite:///mlflow.db"
    assert tracking.ui_hint("file:///tmp/mlruns", "3") is None


@pytest.fixture(scope="module")
def ui_on_a_finished_sweep(tmp_path_factory):
    """A two-job DPO sweep (micro sizes, tests/test_team_scale.DPO_MICRO) in a fresh folder, its store served by
    `mlflow server` (benchmarks/screenshots.py, which makes the docs' screenshots the same way): (base URL,
    experiment id, parent run, job runs). Skipped without a headless Chromium (apt-get install -y chromium)."""
    from benchmarks import screenshots
    from tests.test_team_scale import DPO_MICRO, run_cmd

    if screenshots.chromium() is None:
        pytest.skip("no headless Chromium on PATH (apt-get install -y chromium)")
    folder = tmp_path_factory.mktemp("ui_sweep")
    r = run_cmd(["-m", "rlhf_lab.entry.run", "-m", *DPO_MICRO, "study=ui_smoke", "algo.beta=0.1,0.3"], folder)
    assert r.returncode == 0, r.stderr[-3000:]
    store = f"sqlite:///{folder / 'mlflow.db'}"
    exp, parent, jobs = screenshots.sweep_runs(store)
    assert len(jobs) == 2
    # the end of the sweep prints where its parent run is in the UI, and the runs list with the headline columns
    assert f"#/experiments/{exp}/runs/{parent.info.run_id}?workflowType=machine_learning" in r.stdout
    assert (f"the jobs side by side: http://127.0.0.1:5000/#/experiments/{exp}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={tracking.HEADLINE_VIEW}") in r.stdout
    # without MLflow's job runner (GenAI evaluation jobs: 8 more processes, which the UI of a sweep never uses), as
    # rlhf-lab-server starts its server (rlhf_lab/entry/server.py): they cost 5 s of CPU to start and 0.3 of a core
    # while they idle, about a third of this file's CPU
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        with screenshots.mlflow_ui(store) as base:
            yield base, exp, parent, jobs


@pytest.mark.slow
def test_the_ui_shows_a_jobs_proxy_vs_gold_figure_and_the_parents_study_figure(ui_on_a_finished_sweep):
    """Issue 68: in headless Chromium, a job's run page shows its proxy_vs_gold.png, the parent's the study figure
    and, as its description, the study's table."""
    from benchmarks.screenshots import page_dom, page_url, shown_image
    from rlhf_lab.analysis.parent_run import STUDY_FIGURE
    from rlhf_lab.analysis.run_figure import FIGURE

    base, exp, parent, jobs = ui_on_a_finished_sweep
    job = jobs[0].info.run_id
    assert shown_image(page_dom(page_url(base, exp, job, f"artifacts/{FIGURE}")), FIGURE)
    pid = parent.info.run_id
    assert shown_image(page_dom(page_url(base, exp, pid, f"artifacts/{STUDY_FIGURE}")), STUDY_FIGURE)
    overview = page_dom(page_url(base, exp, pid))
    assert "<th>gold final</th>" in overview and "algo.beta=0.3" in overview  # the description's table, rendered
    assert not shown_image('<img alt="proxy_vs_gold.png" src="data:image/png;base64,">', FIGURE)  # the UI's icons
    # the runs list shows the headline metrics as columns through the experiment's view, and none without it
    assert ">eval/gold_reward<" in page_dom(tracking.ui_link(base, exp, view=tracking.HEADLINE_VIEW))
    assert ">eval/gold_reward<" not in page_dom(tracking.ui_link(base, exp))
