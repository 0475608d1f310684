"""The study reports computed from the MLflow runs of a sweep (``rlhf-lab-report <study>``, and a sweep's parent run).

- :mod:`~rlhf_lab.analysis.study_runs`: a study's runs read from MLflow (tag ``rlhf_lab.study``), with their
  ``eval/*`` histories, upstream RM and swept setting; the store is ``MLFLOW_TRACKING_URI``, else ``--uri``,
  else ``sqlite:///mlflow.db``;
- :mod:`~rlhf_lab.analysis.fits`: the Gao, Schulman & Hilton 2022 forms of reward against √KL (no fit from
  fewer than 5 points; R² and where the peak lies), and the reward–KL frontier (pure functions);
- :mod:`~rlhf_lab.analysis.markdown`: mean ± spread, number formatting, markdown tables;
- :mod:`~rlhf_lab.analysis.plots`: the study report's figures and a policy run's (matplotlib);
- :mod:`~rlhf_lab.analysis.stats`: the mean's t interval;
- :mod:`~rlhf_lab.analysis.quantities`: per-run quantities (final gold from the test split or the last evaluation,
  the split-half drop from the peak);
- :mod:`~rlhf_lab.analysis.study_report`: ``reports/<study>/README.md``; :mod:`~rlhf_lab.analysis.snapshot` its runs file;
  :mod:`~rlhf_lab.analysis.report_files` where a report may write;
- :mod:`~rlhf_lab.analysis.parent_run`, :mod:`~rlhf_lab.analysis.run_figure`: the study report in a sweep's parent
  run, the figure in each policy run.

The lab's own research (the claims and their verdicts, the one-off studies' reports) is the package
``rlhf_lab_research``, which imports this one. Only FINISHED runs enter figures; nothing is ever filled in for a study
without runs. The metrics are described in docs/metrics.md. Nothing is imported here: import the module you need.
"""
