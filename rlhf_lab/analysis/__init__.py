"""Reports computed from the MLflow runs of the canned studies (``rlhf-lab-report``).

- :mod:`~rlhf_lab.analysis.runs`: a study's runs read from MLflow (tag ``rlhf_lab.study``), with their
  ``eval/*`` histories, upstream RM and swept setting; the store is ``MLFLOW_TRACKING_URI``, else ``--uri``,
  else ``sqlite:///mlflow.db``;
- :mod:`~rlhf_lab.analysis.fits`: the Gao, Schulman & Hilton 2022 forms of reward against √KL (no fit from
  fewer than 5 points; R² and where the peak lies), and the reward–KL frontier (pure functions);
- :mod:`~rlhf_lab.analysis.markdown`: mean ± spread, number formatting, markdown tables;
- :mod:`~rlhf_lab.analysis.plots`: the study report's figures (matplotlib);
- :mod:`~rlhf_lab.analysis.stats`: pure statistics for verdicts (t and bootstrap CIs, paired differences, an
  unbiased split-half drop-from-peak estimator, the three-way verdict);
- :mod:`~rlhf_lab.analysis.study`: ``reports/<study>/README.md``;
- :mod:`~rlhf_lab.analysis.quantities`: per-run quantities for the claims (final gold from the test split or
  the last evaluation, the split-half drop from the peak, changes and per-step summaries);
- :mod:`~rlhf_lab_research.effects`: arms of a study and effects over seeds (paired, one-sample, grouped);
- :mod:`~rlhf_lab_research.claims_registry`: the claims of docs/claims.md as data (studies, effects, margins);
- :mod:`~rlhf_lab_research.claims`: ``reports/claims.md``, a verdict on each claim from its effects' 95%
  intervals;
- :mod:`~rlhf_lab_research.studies.gold_validation`: ``reports/gold_rm_validation/README.md``, gold-RM mode against the
  world's formula (rank agreement, hacking curves, C1 and C4 judged with each gold);
- :mod:`~rlhf_lab_research.studies.gao`: ``reports/gao_rm_scaling/README.md``, Gao et al.'s forms fitted pooled over
  seeds by RM size (PPO at β = 0 and best-of-n), bootstrap intervals over seeds, the trend against RM size;
- :mod:`~rlhf_lab.entry.report`: the ``rlhf-lab-report`` command.

Only FINISHED runs enter figures and verdicts; nothing is ever filled in for a study without runs. The
metrics are described in docs/metrics.md. Nothing is imported here: import the module you need.
"""
