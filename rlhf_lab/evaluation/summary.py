"""The job summary's figures, written so that they are true on any data.

Every held-out figure carries its n (``0.812 ± 0.020 (n=16 test prompts)``): an SE needs at least two prompts, so
with one the figure says ``n=1, no spread`` instead of ``± nan`` (:func:`figure`, :func:`n_text`); below
:data:`SMALL_N` the summary adds one warning line (:func:`small_n_warning`). Lines about the built-in world (its
gold, its filler phrases) are left out where the run has none (:func:`figures_line`). A policy run's one ``ship``
line is :func:`rlhf_lab.evaluation.ship_choice.ship_line`.
"""

from __future__ import annotations

import math

SMALL_N = 10  # fewer held-out prompts (or pairs) than this: the summary warns that its figures are noise
WORLD_ONLY = ("filler_rate",)  # metrics that are concepts of the built-in world (its filler phrases)


def n_text(n: int, unit: str) -> str:
    """``n=16 test prompts``, ``n=1 eval pair``."""
    n = int(n)
    return f"n={n} {unit}{'' if n == 1 else 's'}"


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def figure(value: float, se: float | None = None, digits: int = 3) -> str:
    """``0.812 ± 0.020``; without a finite SE (one prompt, or no SE kept) the value alone."""
    text = f"{value:.{digits}f}"
    return text + (f" ± {se:.{digits}f}" if finite(se) else "")


def metric_n(metrics: dict, prefix: str) -> int | None:
    """How many prompts an evaluation's metrics stand on (``<prefix>n_prompts``), None where not recorded."""
    n = (metrics or {}).get(f"{prefix}n_prompts")
    return int(n) if finite(n) else None


def spread_note(n: int | None, unit: str, unknown: str = "") -> str:
    """``n=16 test prompts``, or ``n=1 test prompt, no spread`` (an SE needs two); `unknown` where n was not
    recorded."""
    if n is None:
        return unknown
    return n_text(n, unit) + (", no spread" if n < 2 else "")



def proxy_line(start: dict, end: dict) -> str:
    """The summary's ``proxy`` line: the test prompts' proxy reward at the start and the end of a run, with its n."""
    n = metric_n(end, "test/")
    return (f"{start.get('test/proxy_reward', float('nan')):.3f} -> {end['test/proxy_reward']:.3f} "
            f"({spread_note(n, 'test prompt', unknown='test prompts')})")

def figures_line(metrics: dict, prefix: str, unit: str, world: bool,
                 keys=("gold_reward", "formula_gold_reward", "proxy_reward", "kl", "length", "filler_rate",
                       "distinct_2")) -> str | None:
    """The summary's ``final test`` / ``final eval`` line: each of `keys` logged under `prefix` (± its SE when there
    is one), then the n it stands on; the world's own metrics (:data:`WORLD_ONLY`) only with `world` (the built-in
    world's data). None when none of them was logged."""
    metrics = metrics or {}
    shown = [k for k in keys if prefix + k in metrics and (world or k not in WORLD_ONLY)]
    if not shown:
        return None
    n = metric_n(metrics, prefix)
    one = n is not None and n < 2
    parts = [f"{k}={figure(metrics[prefix + k], None if one else metrics.get(prefix + k + '_se'))}" for k in shown]
    note = spread_note(n, unit)
    return ", ".join(parts) + (f" ({note})" if note else "")


def small_n_warning(counts: dict[str, int | None]) -> str | None:
    """One line when any held-out figure stands on fewer than :data:`SMALL_N` prompts or pairs: `counts` maps what
    was counted (``"test prompt"``, ``"eval pair"``) to its n (None: not recorded)."""
    small = [n_text(n, unit) for unit, n in counts.items() if n is not None and n < SMALL_N]
    if not small:
        return None
    return (f"held-out figures on {' and '.join(small)} (fewer than {SMALL_N}): too few to tell a real change from "
            "noise; use more held-out data (eval.n_prompts, eval.n_test_prompts, or a dataset with more prompts)")


def best_gold(curve: list[tuple[int, float]]) -> tuple[int, float] | None:
    """(step, gold) of the best evaluation of a gold curve [(step, eval gold)] (the first of ties), None if empty."""
    points = [(s, g) for s, g in curve if finite(g)]
    if not points:
        return None
    return max(points, key=lambda p: (p[1], -p[0]))


def held_out_counts(meta: dict) -> dict[str, int | None]:
    """The n of a job's held-out figures, for :func:`small_n_warning`: its test and eval prompts (``<split>/n_prompts``
    of the last evaluations, ``meta["test"]`` and ``meta["eval"]``) and an RM's held-out pairs (``rm/n_eval_pairs``)."""
    ev = meta.get("eval") or {}
    pairs = ev.get("rm/n_eval_pairs")
    return {"test prompt": metric_n(meta.get("test") or {}, "test/"), "eval prompt": metric_n(ev, "eval/"),
            "eval pair": int(pairs) if finite(pairs) else None}
