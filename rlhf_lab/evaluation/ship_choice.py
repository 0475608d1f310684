"""The checkpoint a policy job ships, and the figures quoted with it (issue 67).

The product ships by one rule, :data:`RULE` with :data:`PARAMS` (:func:`rlhf_lab.evaluation.ship.proxy_minus_sqrt_kl`:
the checkpoint maximising proxy − 0.2·√KL, the proxy being the training batches' mean ``objective/scores`` since the
previous evaluation, as the rules were fitted), the rule of least regret in the design phase. :data:`FIGURES` holds
what the prospective test (``reports/ship/test.md``, scored once on 129 runs made after the rules froze:
``reports/ship/PROTOCOL.md``) measured of it; a test checks them against that report and the rule's parameters
against ``reports/ship/rules.json``. There it had the least mean regret of every rule and beat the clock, but its
paired interval against the last checkpoint reached 0: the docs (docs/without-gold.md) say so beside the figures.

:class:`OnlineShip` makes the rule's choice while a run trains: at each evaluation it says whether that checkpoint is
the best so far, so the job keeps one copy of it (:class:`rlhf_lab.evaluation.callbacks.ShipCheckpoint`); its choice
at the end is the rule's on the whole run (a test compares them). :func:`ship_line` is the job summary's one
``ship`` line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlhf_lab.evaluation import ship as S
from rlhf_lab.evaluation.summary import best_gold, n_text

RULE = "proxy_minus_sqrt_kl"
PARAMS = {"cost": 0.2}  # reports/ship/rules.json's, frozen


@dataclass(frozen=True)
class Figures:
    """What a report measured of :data:`RULE` on runs with a gold: its mean gold regret with a 95 % interval
    clustered by study and seed, and the fraction of runs where it shipped a checkpoint worse than the start."""

    source: str  # the report the figures are quoted from
    phase: str  # "prospective": measured on runs made after the rule froze
    runs: int
    regret: float
    regret_lo: float
    regret_hi: float
    worse_than_start: float

    def text(self) -> str:
        return (f"{self.phase} figures, {self.runs} runs with the world's gold ({self.source}): mean gold regret "
                f"{self.regret:.3f} [{self.regret_lo:.3f}, {self.regret_hi:.3f}], ships worse than the start in "
                f"{100 * self.worse_than_start:.1f} % of runs")


# reports/ship/test.md's row of proxy_minus_sqrt_kl ("mean regret" and "ships worse than the start"), the prospective
# test's (the design phase's in-sample figures were 961 runs, 0.074 [0.033, 0.155], 1.5 %: reports/ship/design.md)
FIGURES = Figures("reports/ship/test.md", "prospective", 129, 0.097, 0.034, 0.155, 0.039)


def rule_text() -> str:
    return f"proxy - {PARAMS['cost']:g}*sqrt(KL)"


class OnlineShip:
    """:data:`RULE` made online. Feed every training step's proxy (:meth:`train_step`) and every evaluation's KL
    (:meth:`evaluation`, which says whether this evaluation's checkpoint is now the one to ship). The proxy of
    evaluation i ≥ 1 is the mean of the steps in (t_{i−1}, t_i]; the start's (i = 0) is the first training step's,
    known only after it: at the start the only checkpoint is shipped, and from then on the choice only moves to the
    newest evaluation, as ``first_argmax`` over the whole run does."""

    STATE = ("steps", "proxy", "kl", "pending", "taken", "best")

    def __init__(self, cost: float = PARAMS["cost"]):
        self.cost = float(cost)
        self.steps: list[int] = []
        self.proxy: list[float] = []
        self.kl: list[float] = []
        self.pending: list[float] = []  # proxies of the steps since the last evaluation
        self.taken = -1  # the last step whose proxy was taken
        self.best: int | None = None  # index of the checkpoint to ship

    def train_step(self, step: int, proxy: float | None) -> None:
        """Step `step`'s training proxy (``objective/scores``; None: not logged), taken once."""
        if step <= self.taken:
            return
        self.taken = step
        if proxy is None:
            return
        if len(self.steps) == 1 and not math.isfinite(self.proxy[0]):  # p_0: the first step after the start
            self.proxy[0] = float(proxy)
            self.best = self.choice()
        self.pending.append(float(proxy))

    def evaluation(self, step: int, kl: float) -> bool:
        """Evaluation at `step` with KL `kl`; True when its checkpoint is now the one to ship."""
        # numpy's mean, as objective.interval_means (the rules' fit) computes it, to the last bit
        proxy = float(np.mean(self.pending)) if self.pending and self.steps else math.nan
        self.pending = []
        self.steps.append(int(step))
        self.proxy.append(proxy)
        self.kl.append(float(kl))
        self.best = self.choice()
        if self.best is None and len(self.steps) == 1:  # the start, its proxy not known yet: the only checkpoint
            self.best = 0
        return self.best == len(self.steps) - 1

    def choice(self) -> int | None:
        if not self.steps:
            return None
        return S.proxy_minus_sqrt_kl(self.curve(), self.cost)

    def curve(self) -> S.Curve:
        return S.Curve(tuple(self.steps), tuple(self.proxy), tuple(self.kl))

    def value(self, i: int) -> float:
        return self.proxy[i] - self.cost * math.sqrt(max(self.kl[i], 0.0))

    @property
    def step(self) -> int | None:
        return None if self.best is None else self.steps[self.best]

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.STATE}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def gold_regret(eval_gold: dict[int, float], test_gold: dict[int, float], step: int) -> float | None:
    """The gold regret of shipping `step` (:func:`rlhf_lab.evaluation.ship.selection_regret`): the best checkpoint
    chosen by its eval gold, both measured on the test prompts; None unless every evaluation has both."""
    steps = sorted(eval_gold)
    if not steps or step not in eval_gold or any(s not in test_gold for s in steps):
        return None
    return S.selection_regret([eval_gold[s] for s in steps], [test_gold[s] for s in steps], steps.index(step))


def ship_line(choice: OnlineShip, path: str | None, gold_curve: list[tuple[int, float]] | None = None,
              n_eval: int | None = None, regret: float | None = None, n_test: int | None = None) -> str:
    """The summary's ``ship`` line: the step to ship and where it is saved (`path`; None: not saved), the rule and its
    n (evaluations), the figures it is quoted with (:data:`FIGURES`); with a gold (`gold_curve`: eval gold per step),
    the gold's own best step by eval gold beside it, said to be the gold's and not a second recommendation, and
    `regret` (test prompts) where it was measured."""
    n = n_text(len(choice.steps), "evaluation")
    if choice.step is None:
        return f"no checkpoint chosen: the run logged no training proxy (objective/scores) for {rule_text()} ({n})"
    where = f"saved at {path}" if path else "not saved (a sharded policy is whole only at the end)"
    text = (f"step {choice.step} by {rule_text()} (value {choice.value(choice.best):.3f}; {n}), {where}; "
            f"{FIGURES.text()}")
    best = best_gold(gold_curve or [])
    if best is not None:
        text += (f"; the gold's own best, which a user without gold cannot see: step {best[0]} (eval gold "
                 f"{best[1]:.3f}" + (f", {n_text(n_eval, 'eval prompt')})" if n_eval is not None else ")"))
        if regret is not None:
            text += f"; gold regret of this choice {regret:.3f}" + (
                f" ({n_text(n_test, 'test prompt')})" if n_test is not None else " (test prompts)")
    return text
