"""rlhf_lab_research: the lab's own research, beside its reports.

Claims and their verdicts, the statistics behind them, the one-off studies and the ship-rule study. It imports
:mod:`rlhf_lab` (the package that runs and reports a user's job and sweep) and is never imported by it
(tests/test_architecture.py checks the direction).
"""
