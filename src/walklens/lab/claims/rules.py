"""The verdict rules: how a measured figure becomes a verdict, never stronger than its interval and controls."""

from __future__ import annotations

import math
from collections.abc import Callable

from .base import CHANCE, Measured

# ---- verdict rules -------------------------------------------------------------------------------------------------


def _nan(*xs: float) -> bool:
    """Whether a bound is NaN (reported as NaN; nothing is decided on it)."""
    return any(math.isnan(x) for x in xs)


def _below_baseline(m: Measured, target: float | None) -> str:
    """The seed: the scheme does not reach the ordinary run.  Decided by the paired test where the file holds
    one, else only when the held-out interval excludes the baseline."""
    p = m.facts.get("paired_p")
    if p is not None:
        if p < 0.05:
            return "reproduced (paired test)" if m.facts["paired_hi"] < 0 else "contradicted (paired test)"
        return "not decided: paired test p >= 0.05"
    base = m.facts["baseline"]
    if m.hi < base:
        return "reproduced (interval below the baseline)"
    if m.lo > base:
        return "contradicted (interval above the baseline)"
    return "not decided: the interval includes the baseline (no paired test in this file)"


def _reaches(m: Measured, target: float | None) -> str:
    """The seed's normalised best (``target``) against the held-out normalised interval."""
    assert target is not None
    boot = "boot_norm_lo" in m.facts
    lo, hi = m.facts.get("boot_norm_lo", m.facts["norm_lo"]), m.facts.get("boot_norm_hi", m.facts["norm_hi"])
    how = "bootstrap interval" if boot else "interval: Wilson / baseline, without the baseline's uncertainty"
    if _nan(lo, hi):
        return f"not decided: the held-out interval is NaN ({how})"
    if lo > target:
        return f"reaches it: held out above the seed's in-sample {target:.3f} ({how})"
    if hi < target:
        return f"not reproduced: held out below the seed's {target:.3f} ({how})"
    return f"not decided: the held-out interval includes the seed's {target:.3f} ({how})"


def _above_chance(m: Measured, target: float | None) -> str:
    if m.lo > CHANCE:
        return "reproduced (interval above chance 0.25)"
    if m.hi < CHANCE:
        return "contradicted (interval below chance)"
    return "not decided: the interval includes chance 0.25"


def _compaction(m: Measured, target: float | None) -> str:
    if _nan(m.lo, m.hi, m.facts["drop_lo"], m.facts["drop_hi"]):
        return "not decided: an interval of compaction or dropping is NaN"
    if m.hi < m.facts["drop_lo"]:
        return "not reproduced here: keeps less than dropping the examples (HellaSwag prefixes, not long contexts)"
    if m.lo > m.facts["drop_hi"]:
        return "reproduced on HellaSwag prefixes: keeps more than dropping the examples"
    return "not decided: the intervals of compaction and dropping overlap"


def _sink(m: Measured, target: float | None) -> str:
    return (
        f"not the seed's measure: low self mass is not A.2's kernel-based negative self-bias; the attention sink "
        f"accounts for most of it ({m.value:.0%} -> {m.facts['sink']:.0%} of heads with position 0 removed)"
        if m.facts["sink"] < m.value / 2
        else "low self mass survives the attention-sink control; still not A.2's kernel-based definition"
    )


def _tilt(m: Measured, target: float | None) -> str:
    """Tokens tilt toward v1: alignment above the other layers' v1 (the anisotropy-aware band) beyond chance."""
    if m.facts["p_other"] < 0.05:
        return "reproduced at some layers: more layers above the other-layer band than chance gives"
    return (
        f"not supported: {int(m.facts['above_other'])} of {int(m.facts['layers'])} layers above the other-layer "
        f"band, as chance gives; the output gains alignment at {int(m.facts['gain'])} (mean change "
        f"{m.facts['change']:+.3f})"
    )


def _steer(m: Measured, target: float | None) -> str:
    k, n = int(m.facts["eigen_top1"]), int(m.facts["prompts"])
    if k == n:
        return (
            f"reproduced on these {n} prompts: eigen-steering puts the target on top of every one (top-1 only; "
            "the coherence of the text and held-out prompts are the steering card's, docs/power.md)"
        )
    if k == 0:
        return "not reproduced: eigen-steering puts the target on top of no prompt at any tried setting"
    return f"partly: eigen-steering puts the target on top of {k} of {n} prompts at its best tried setting"


def _associative(m: Measured, target: float | None) -> str:
    """Result 4 on token vectors: PMI-similarity correlation above 0, surviving both frequency controls."""
    f = m.facts
    if m.hi < 0:
        return "contradicted: co-occurrence and cosine correlate negatively"
    if not 0 < m.lo <= m.hi:  # a NaN bound (a jackknife of too few groups) decides nothing
        return "not decided: the interval of the PMI-cosine correlation includes 0"
    kept = f"given frequencies {f['partial_cos']:+.2f}, excess over matched partners {f['excess_cos']:+.2f}"
    if f["partial_cos_lo"] > 0 and f["excess_cos_lo"] > 0:
        return (
            f"reproduced weakly, token vectors only: rho {m.value:+.2f} survives both frequency controls ({kept}); "
            "context vectors not measured"
        )
    return f"not decided: rho {m.value:+.2f} does not survive a frequency control ({kept})"


def _blocks(m: Measured, target: float | None) -> str:
    """Numbers and brackets alike in every map; separators alike in none (within not above between)."""
    f, n = m.facts, int(m.facts["maps"])
    num, br, sep = (int(f[f"{c}_alike"]) for c in ("number", "bracket", "separator"))
    parts = [f"numbers alike in {num}/{n} maps", f"brackets in {br}/{n}", f"separators not alike in {n - sep}/{n}"]
    if num == n and br == n and sep == 0:
        return "reproduced: " + ", ".join(parts)
    if num == 0 and br == 0:
        return "not reproduced: " + ", ".join(parts)
    return "partly: " + ", ".join(parts)


def _self_bias(m: Measured, target: float | None) -> str:
    if m.facts["p_sink"] < 0.05 and m.facts["sig_sink"] > m.facts["expected"]:
        return (
            f"partly: negative self-bias in {m.value:.0%} of a decoder-only model's heads ({m.facts['sink']:.0%} "
            "with the sink removed), far above chance; the seed's ~80% concerns T5 encoders (not measurable here)"
        )
    return "not reproduced: no more heads below zero than chance gives once the attention sink is removed"


def _self_rank(m: Measured, target: float | None) -> str:
    if not m.facts["encoder"]:
        return "not measurable here: the model has no encoder stack"
    if not m.facts["trained"]:
        return (
            "not measurable here: no trained encoder-decoder weights reachable (PyPI has none; the hub is "
            "unreachable); the command runs, on a random tiny T5 that can neither reproduce nor contradict it"
        )
    if m.lo > 0.5:
        return "reproduced: the encoder's c_t ranks w_t above another position's token"
    return "not reproduced: c_t does not rank w_t above another position's token beyond chance"


def _concept_eval(m: Measured, target: float | None) -> str:
    f = m.facts
    if not f["chance_control_lo"] <= 0.5 <= f["chance_control_hi"]:
        return "not decided: the chance control is off 1/2"
    if m.lo > 0.5:
        order = "not word order" if f["own_vs_shuffled_lo"] <= 0.5 else "and word order"
        gold = "does not tell" if f["gold_vs_distractors_lo"] <= 0.5 else "tells"
        return (
            "partly: the concept score tells the model's own continuation from an off-topic one (interval above "
            f"1/2, chance control at 1/2): it reads the topic, {order}; it {gold} the true ending from the "
            "distractors (a topical check, not a quality score)"
        )
    return "not reproduced: the concept score does not separate own from off-topic continuations beyond chance"


RULES: dict[str, Callable[[Measured, float | None], str]] = {
    "self_bias": _self_bias,
    "self_rank": _self_rank,
    "concept_eval": _concept_eval,
    "associative": _associative,
    "blocks": _blocks,
    "steer": _steer,
    "tilt": _tilt,
    "sink": _sink,
    "below_baseline": _below_baseline,
    "reaches": _reaches,
    "above_chance": _above_chance,
    "compaction": _compaction,
}

#: the rules that compare the figure with the seed's own (a claim with one of them names its ``target``)
TAKES_TARGET = frozenset({"reaches"})
