"""The stages of an RLHF run, one module each: pretrain -> sft -> prefs -> rm -> ppo | dpo (``grpo`` and ``rloo`` run
the ``ppo`` module under their own name: :data:`rlhf_lab.stages.pipeline.ALIASES`).

Every stage module has the same three parts:

- ``spec(cfg)``: what determines the stage's artifact (its cache key, :mod:`rlhf_lab.runs.cache`); computing
  it ensures the upstream artifacts it names;
- ``build(cfg, out_dir, spec)``: trains or samples the artifact into ``out_dir`` as its own MLflow run
  (:func:`rlhf_lab.runs.tracking.start_run`, logged params included) and returns its metadata;
- ``WHAT``: the words that announce a reused artifact.

:func:`ensure` returns a stage's artifact folder, building it first when it is missing; :func:`run_job`
runs the stage named by ``algo`` as the job (always built, into the Hydra output folder, then published
to the cache). The stage modules import the shared ones (:mod:`.pipeline`, :mod:`.presets`, :mod:`.training`, :mod:`.evaluate`) and nothing above them.
"""

from rlhf_lab.stages.pipeline import STAGES, ensure, run_job

__all__ = ["STAGES", "ensure", "run_job"]
