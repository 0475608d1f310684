"""The claims report's Statistics paragraph: which inference is used where, and why (:func:`statistics_text`)."""

from __future__ import annotations

from rlhf_lab.analysis.anytime import MARK
from rlhf_lab.analysis.designs import RM_CLAIM_RMS
from rlhf_lab.analysis.verdicts import ALPHA, POWER


def statistics_text(m: int) -> str:
    """The Statistics paragraph: the interval, the p-values, Holm's family (m judged effects), the verdict rules."""
    return ("**Statistics.** An effect is a mean over units (normally seeds) with its 95% Student-t interval. Paired "
            "designs run the compared settings with the same seeds and average the per-seed differences (\"paired\" "
            "after n: the seeds both settings ran); the others take one value per unit (a change over training, a "
            "drop, one value per distinct RM). Each judged effect has a one-sided p-value from its t statistic "
            "(df = n − 1), on the side of 0 its estimate lies (\"against\": the side opposite to the claim); p < 0.025 "
            "exactly when the 95% interval excludes 0 on that side. **Seeds added after looking** "
            f"(marked {MARK}): a study whose runs include seeds beyond those its study file sweeps (the provenance "
            "table's \"added\") was extended after its results were seen, and a fixed-n t interval is not valid at an "
            "n chosen from the data (optional stopping). Every judged effect and precondition that reads the runs of "
            "such an added seed is judged instead with the anytime-valid t confidence sequence (Wang & Ramdas 2023, "
            "\"Anytime-valid t-tests and confidence sequences for Gaussian means with unknown variance\"; the "
            "t-mixture of Lai 1976, tuned to be narrowest at 10 seeds, unbounded below 5), valid at any n however "
            "the seeds were chosen: its 95% interval, and as p the sequence's own p = 1/E_n, used as is as the "
            f"one-sided p at {ALPHA:g} (it is the two-sided sequence's p, so it is conservative by up to 2×; here "
            "p < 0.025 when the 97.5% sequence excludes 0, so a 95% sequence that excludes 0 need not make the effect "
            "hold), in the same Holm family as the others; every other effect keeps its fixed-n t interval and p "
            "(an effect whose pairing leaves the added seeds out, with a study that did not run them, is marked all "
            "the same: conservative). "
            "**Multiplicity:** the family is every judged "
            f"effect of this report with a p-value (m = {m}); verdicts use Holm's step-down correction at a family-wise "
            f"level of {ALPHA:g} per side (the 95% intervals' 2.5 % a side; 5 % for any wrong verdict either way), "
            "and the tables show the unadjusted interval and p beside the Holm-adjusted p and verdict. A judged "
            f"effect **holds** when its Holm-adjusted p is below {ALPHA:g} on the claimed side, **does not hold** when "
            f"it is below {ALPHA:g} on the other side or its (unadjusted) interval lies inside ±margin (negligible), "
            "and is **inconclusive** otherwise, including n < 2. A non-inferiority effect (\"at least as well, "
            "within the margin\") is tested against −margin instead of 0 and has no negligible zone. A claim holds "
            "when all its judged effects hold and does not hold when one does not. A precondition (what the claim "
            "presupposes, e.g. hacking to reduce) is judged on its unadjusted interval, outside the family; one that "
            "is not shown makes the claim inconclusive, **except** that a judged effect shown against the claim "
            "(Holm-adjusted) makes it \"does not hold\" all the same. Shown effects are reported, not judged, and "
            "worded from their unadjusted interval alone: a direction when it excludes 0, \"no … detected\" only "
            "when it lies inside ±margin, inconclusive otherwise. "
            f"**Power:** an inconclusive effect states the units that {POWER:.0%} power would need (one-sided t test, "
            "noncentral t) to detect a true effect the size of its estimate, or of the margin if larger, with its "
            f"observed spread (for a {MARK} effect: the n at which its sequence at that level, widened by 0.84 standard errors, would exclude 0 for such an effect, the spread taken as known), at level {ALPHA:g}/m for a judged effect (Holm's strictest step: an effect reaching "
            f"it holds after the correction whatever the others) and {ALPHA:g} for a precondition. **Replication:** "
            "each section counts the distinct upstream RMs and SFT policies per arm (`rlhf_lab.upstream.*` tags); "
            "a factor with one per arm is held fixed, and the verdict is conditional on it. A claim about the RM "
            f"needs at least {RM_CLAIM_RMS} distinct RMs per arm, else it is inconclusive (\"not replicated\").")
