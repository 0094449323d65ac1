"""The verdict rules: how a measured figure becomes a verdict, never stronger than its interval and controls.

Every verdict starts with one of :data:`VERDICTS`, each defined once in docs/claims.md ("Verdicts") with its
rule; a Test 1/2 verdict reads paired evidence only (McNemar on the picks of the same items, paired bootstrap
intervals: :mod:`.pairs`), never an interval set against a point baseline."""

from __future__ import annotations

import math
from collections.abc import Callable

from .base import CARD_OTHERS, CHANCE, Measured

#: the verdict words, defined in docs/claims.md: every verdict is ``WORD: why``
VERDICTS = ("reproduced", "not reproduced", "not decided", "partly", "not measurable here")
#: the level of every paired test a verdict reads
ALPHA = 0.05
#: each verdict word's rule, as docs/claims.md states it (rendered from here: the one definition)
VERDICT_RULES = {
    "reproduced": "the row's test decides for the seed's claim: a paired test on the same items (exact McNemar, "
    "p < 0.05) in the claimed direction, or, where the claim is not a comparison of two scorers, its 95% interval "
    "on the claimed side of a fixed reference (chance, 1/2, a chance band)",
    "not reproduced": "the same test decides against the claim: significant in the other direction, or the "
    "interval on the other side of the reference",
    "not decided": "neither: the paired test has p >= 0.05, the interval holds the reference, no paired evidence "
    "is committed for the row, or the seed's figure is not comparable like for like (its baseline and n not given)",
    "partly": "the claim holds for a stated part only (some models, heads, layers or classes), or in a weaker "
    "reading the verdict names",
    "not measurable here": "what the claim needs cannot be had here (no trained weights reachable, a metric the "
    "seed does not report), or the seed does not make it measurable",
}


def say(word: str, why: str) -> str:
    """A verdict: one of :data:`VERDICTS`, then why."""
    if word not in VERDICTS:
        raise ValueError(f"{word!r} is not a verdict word ({', '.join(VERDICTS)})")
    return f"{word}: {why}"


def _nan(*xs: float) -> bool:
    """Whether a bound is NaN (reported as NaN; nothing is decided on it)."""
    return any(math.isnan(x) for x in xs)


def _paired(m: Measured, key: str, what: str) -> tuple[str, str] | None:
    """The word and reason of a paired test ``key`` (facts ``key_p``, ``key_lo``, ``key_hi``: the Test minus
    ``what`` on the same items), None when the file holds none."""
    p = m.facts.get(f"{key}_p")
    if p is None:
        return None
    lo, hi = m.facts[f"{key}_lo"], m.facts[f"{key}_hi"]
    test = f"Test - {what} [{lo:+.3f}, {hi:+.3f}], McNemar p={p:.2g}"
    if p < ALPHA and hi < 0:
        return "below", test
    if p < ALPHA and lo > 0:
        return "above", test
    return "undecided", test


def _paired_verdict(m: Measured, key: str, what: str, none: str, sides: dict[str, tuple[str, str]]) -> str:
    """The verdict of the paired test ``key`` (the Test minus ``what`` on the same items): ``none`` where the file
    holds no such test, else the word and reason ``sides`` give the side it falls on (below, above, undecided)."""
    got = _paired(m, key, what)
    if got is None:
        return say("not decided", none)
    side, test = got
    word, why = sides[side]
    return say(word, f"{why} ({test})")


def _below_baseline(m: Measured, target: float | None) -> str:
    """The seed: the best scheme does not reach the ordinary run; the paired test on the same items decides."""
    return _paired_verdict(m, "paired", "baseline", "no paired test on these items (no per-item picks committed)", {
        "below": ("reproduced", "below the baseline on the same items"),
        "above": ("not reproduced", "above the baseline on the same items"),
        "undecided": ("not decided", "the paired interval holds 0"),
    })  # fmt: skip


def _context(m: Measured, target: float | None) -> str:
    """The concept vectors carry the context: the Test against the shuffled control (another item's concept vectors
    on the same items and endings)."""
    return _paired_verdict(m, "shuffled", "shuffled context", "no shuffled-context control on these items", {
        "above": ("reproduced", "the item's own concept vectors beat another item's on the same items"),
        "below": ("not reproduced", "another item's concept vectors score higher"),
        "undecided": ("not decided", "own and another item's concept vectors are not told apart"),
    })  # fmt: skip


def _seed_baseline(r: float, x: float) -> float:
    """The baseline at which the seed's raw ratio ``r`` is the chance-corrected ratio ``x``: solves
    ``(r b - c) / (b - c) = x`` for ``b`` (infinite where ``x >= r``: no baseline gives it)."""
    return CHANCE * (1 - x) / (r - x) if x < r else math.inf


def _seed_figure(m: Measured, target: float | None) -> str:
    """The seed's normalised best (``target``: in-sample, acc / baseline of gpt-neo-1.3B, its baseline and n not
    given) against this row's chance-corrected interval: not comparable like for like; says which baseline of the
    seed's would make them equal."""
    assert target is not None
    lo, hi = m.facts.get("cc_lo", math.nan), m.facts.get("cc_hi", math.nan)
    if _nan(lo, hi):
        return say("not decided", "no chance-corrected interval to set beside the seed's figure")
    b1, b2 = max(_seed_baseline(target, lo), CHANCE), min(_seed_baseline(target, hi), 1.0)
    where = f"only if that baseline lay in [{b1:.3f}, {b2:.3f}]" if b1 <= b2 else "at no baseline in (0.25, 1]"
    return say(
        "not decided",
        f"not comparable like for like: the seed's {target:.3f} is acc / baseline of gpt-neo-1.3B (a best scheme's: "
        f"chosen and scored on the same items), its baseline and n not given; it equals this row's chance-corrected "
        f"[{lo:.3f}, {hi:.3f}] {where}",
    )


def _unique(m: Measured, target: float | None) -> str:
    """The seed: the best scheme is unique per model.  At 200 items the pick is noisy: it decides nothing where
    a model's own folds do not agree on one scheme."""
    f = m.facts
    if f["unstable"]:
        return say(
            "not decided",
            f"the models' best schemes differ in {int(f['differ'])} of {int(f['pairs'])}, but the pick is not stable "
            f"within a model ({int(f['unstable'])} runs' folds chose more than one scheme): at 200 items selection "
            "noise can make two models' bests differ",
        )
    word = "reproduced" if f["differ"] == f["pairs"] else "not reproduced"
    return say(word, f"the models' stable best schemes differ in {int(f['differ'])} of {int(f['pairs'])}")


def _moves_away(m: Measured, target: float | None) -> str:
    """Fig. 9c: a decoder's output d_t moves away from its own token w_t: it ranks w_t no higher than another
    position's token (the share of positions where it does, against 1/2)."""
    if m.hi < 0.5:
        return say("reproduced", "d_t ranks its own token below another position's token")
    if m.lo > 0.5:
        return say("not reproduced", "d_t still ranks its own token above another position's token")
    return say(
        "not decided",
        f"own token ahead of the control at a share whose interval holds 1/2 ([{m.lo:.2f}, {m.hi:.2f}], {m.n} "
        "positions of one text): far from the nearest, not told apart from another token",
    )


def _other_metric(m: Measured, target: float | None) -> str:
    return say(
        "not measurable here",
        "the seed's figures are acc (hellaswag:acc:pct, Figs. 13-16); acc_norm has no seed figure to compare",
    )


def _above_chance(m: Measured, target: float | None) -> str:
    """Above chance 0.25, a known constant (not an estimated baseline): the Wilson interval decides."""
    if m.lo > CHANCE:
        return say(
            "reproduced",
            "the interval lies above chance 0.25 (the scorer beats chance; whether it uses the context is the "
            "shuffled-context rows')",
        )
    if m.hi < CHANCE:
        return say("not reproduced", "the interval lies below chance")
    return say("not decided", "the interval holds chance 0.25")


def _compaction(m: Measured, target: float | None) -> str:
    if _nan(m.lo, m.hi, m.facts["drop_lo"], m.facts["drop_hi"]):
        return say("not decided", "an interval of compaction or dropping is NaN")
    if m.hi < m.facts["drop_lo"]:
        return say("not reproduced", "keeps less than dropping the examples (HellaSwag prefixes, not long contexts)")
    if m.lo > m.facts["drop_hi"]:
        return say("reproduced", "on HellaSwag prefixes: keeps more than dropping the examples")
    return say("not decided", "the intervals of compaction and dropping overlap")


def _sink(m: Measured, target: float | None) -> str:
    if m.facts["sink"] < m.value / 2:
        return say(
            "not reproduced",
            f"low self mass is the attention sink: {m.value:.0%} of heads below uniform, {m.facts['sink']:.0%} "
            "with position 0 removed (and it is not A.2's kernel-based negative self-bias: its row is below)",
        )
    return say("partly", "low self mass survives the attention-sink control; still not A.2's kernel-based definition")


def _tilt(m: Measured, target: float | None) -> str:
    """Tokens tilt toward v1: alignment above the other layers' v1 (the anisotropy-aware band) beyond chance."""
    if m.facts["p_other"] < ALPHA:
        return say("partly", "more layers above the other-layer band than chance gives (some layers, not all)")
    return say(
        "not reproduced",
        f"{int(m.facts['above_other'])} of {int(m.facts['layers'])} layers above the other-layer band, as chance "
        f"gives; the output gains alignment at {int(m.facts['gain'])} (mean change {m.facts['change']:+.3f})",
    )


def _steer_card(m: Measured, target: float | None) -> str:
    """Seed 002's steering on the held-out card: eigen-steering's effect on the target (its cell chosen on other
    prompts within the perplexity budget) against 0, the projection-ablation control and the other methods at the
    same budget; intervals that overlap decide nothing (no paired test across methods is committed)."""
    f = m.facts
    eigen = f"eigen-steering {m.value:+.2f} [{m.lo:+.2f}, {m.hi:+.2f}] on held-out prompts"
    control = f"the projection-ablation control's [{f['control_lo']:+.2f}, {f['control_hi']:+.2f}]"
    other = f"{CARD_OTHERS[int(f['other'])]}'s [{f['other_lo']:+.2f}, {f['other_hi']:+.2f}]"
    if _nan(m.lo, m.hi):
        return say("not decided", "no eigen-steering cell kept the perplexity budget on the choosing prompts")
    if m.hi < 0:
        return say("not reproduced", f"{eigen} moves the target away ({other} at the same budget)")
    if m.lo > 0 and not m.lo <= f["control_hi"]:  # a NaN control bound decides nothing
        if m.hi < f["other_lo"]:
            return say("partly", f"{eigen} moves toward the target beyond {control}, less far than {other}")
        return say("reproduced", f"{eigen} moves toward the target beyond {control}, as far as {other}")
    if m.lo > 0:
        return say("not decided", f"{eigen} moves toward the target, no further than {control} ({other})")
    return say("not decided", f"the interval of {eigen} holds 0 ({other} at the same budget)")


def _associative(m: Measured, target: float | None) -> str:
    """Result 4 on token vectors: PMI-similarity correlation above 0, surviving both frequency controls."""
    f = m.facts
    if m.hi < 0:
        return say("not reproduced", "co-occurrence and cosine correlate negatively")
    if not 0 < m.lo <= m.hi:  # a NaN bound (a jackknife of too few groups) decides nothing
        return say("not decided", "the interval of the PMI-cosine correlation includes 0")
    kept = f"given frequencies {f['partial_cos']:+.2f}, excess over matched partners {f['excess_cos']:+.2f}"
    if f["partial_cos_lo"] > 0 and f["excess_cos_lo"] > 0:
        return say(
            "partly",
            f"token vectors only: rho {m.value:+.2f} survives both frequency controls ({kept}); context vectors "
            "not measured",
        )
    return say("not decided", f"rho {m.value:+.2f} does not survive a frequency control ({kept})")


def _blocks(m: Measured, target: float | None) -> str:
    """Numbers and brackets alike in every map.  The seed's separators show weak similarity to everything (light
    bands, Figs. 3, 11, 12); the within - between contrast measures dissimilarity among separators instead, so
    the verdict reads numbers and brackets only and says so."""
    f, n = m.facts, int(m.facts["maps"])
    num, br = (int(f[f"{c}_alike"]) for c in ("number", "bracket"))
    parts = (
        f"numbers alike in {num}/{n} maps, brackets in {br}/{n} (separators: the seed's light bands, weak "
        "similarity to everything, are not what the within - between contrast measures)"
    )
    if num == n and br == n:
        return say("reproduced", parts)
    if num == 0 and br == 0:
        return say("not reproduced", parts)
    return say("partly", parts)


def _self_bias(m: Measured, target: float | None) -> str:
    if m.facts["p_sink"] < ALPHA and m.facts["sig_sink"] > m.facts["expected"]:
        return say(
            "partly",
            f"negative self-bias in {m.value:.0%} of a decoder-only model's heads ({m.facts['sink']:.0%} with the "
            "sink removed), far above chance; the seed's ~80% concerns T5 encoders (not measurable here)",
        )
    return say("not reproduced", "no more heads below zero than chance gives once the attention sink is removed")


def _self_rank(m: Measured, target: float | None) -> str:
    if not m.facts["encoder"]:
        return say("not measurable here", "the model has no encoder stack")
    if not m.facts["trained"]:
        return say(
            "not measurable here",
            "no trained encoder-decoder weights reachable (PyPI has none; the hub is unreachable); the command runs, "
            "on a random tiny T5 that can neither reproduce nor contradict it",
        )
    if m.lo > 0.5:
        return say("reproduced", "the encoder's c_t ranks w_t above another position's token")
    return say("not reproduced", "c_t does not rank w_t above another position's token beyond chance")


def _concept_eval(m: Measured, target: float | None) -> str:
    """Footnote 12's evaluator scores a model's output: it must tell the true ending from the distractors, not
    only the model's own continuation from an off-topic one (a topic check)."""
    f = m.facts
    if not f["chance_control_lo"] <= 0.5 <= f["chance_control_hi"]:
        return say("not decided", "the chance control is off 1/2")
    topic = m.lo > 0.5
    gold = f["gold_vs_distractors_lo"] > 0.5
    order = "and word order" if f["own_vs_shuffled_lo"] > 0.5 else "not word order"
    if topic and gold:
        return say("reproduced", f"tells own from off-topic and the true ending from the distractors ({order})")
    if topic:
        return say(
            "not reproduced",
            f"a topic check, not footnote 12's evaluator: it tells the model's own continuation from an off-topic "
            f"one (interval above 1/2; it reads the topic, {order}) but not the true ending from the distractors",
        )
    return say("not reproduced", "the concept score does not separate own from off-topic continuations")


def _selection_below(m: Measured, target: float | None) -> str:
    """The seed's best scheme, not one pick: every one of the sweep's top schemes in sample stays below the
    ordinary run held out (exact McNemar on the same items, Holm-adjusted over the schemes)."""
    k, below, above = int(m.facts["schemes"]), int(m.facts["below"]), int(m.facts["above"])
    if above:
        return say("not reproduced", f"{above} of the {k} best schemes score above the baseline held out")
    if below == k:
        return say("reproduced", f"all {k} best schemes stay below the baseline held out (Holm p <= "
                                 f"{m.facts['holm_p_max']:.2g})")  # fmt: skip
    return say("not decided", f"{below} of the {k} best schemes below the baseline held out after Holm's "
                              "correction, none above")  # fmt: skip


RULES: dict[str, Callable[[Measured, float | None], str]] = {
    "selection_below": _selection_below,
    "self_bias": _self_bias,
    "self_rank": _self_rank,
    "concept_eval": _concept_eval,
    "associative": _associative,
    "blocks": _blocks,
    "steer_card": _steer_card,
    "tilt": _tilt,
    "sink": _sink,
    "below_baseline": _below_baseline,
    "seed_figure": _seed_figure,
    "other_metric": _other_metric,
    "context": _context,
    "unique": _unique,
    "moves_away": _moves_away,
    "above_chance": _above_chance,
    "compaction": _compaction,
}

#: the rules that compare the figure with the seed's own (a claim with one of them names its ``target``)
TAKES_TARGET = frozenset({"seed_figure"})
