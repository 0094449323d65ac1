"""The claims of both seeds that walklens measures, in one registry: each claim's seed section, what the seed
says, the command that measures it, the committed result file it is read from and the rule of its verdict
(seed 000, Singh: sec. 5.1, A.2, footnote 11; seed 002, Li & Altafini).

:func:`render` reads every claim's figure from its result file and writes the table of docs/claims.md, so a
number there is its file's number (a test re-renders it); a claim without a result file is listed with the
verdict "not measured yet" and why.  ``walklens reproduce`` runs the commands (``--quick``: a tiny model).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

CHANCE = 0.25  # HellaSwag: four endings
SIZE = {"smollm2": "135m", "gemma3": "270m"}
BAND_ALPHA = 0.05  # a null layer ends above the top (95th percentile) of a 5-95 % chance band


@dataclass(frozen=True)
class Claim:
    """One claim: ``measure`` names how its figure is read from ``file`` (``select``: which run or rows),
    ``rule`` how the figure becomes a verdict (``target``: the seed's own figure, where the rule compares)."""

    id: str
    seed: str
    says: str
    command: str
    file: str | None = None
    measure: str = ""
    select: Mapping[str, Any] = field(default_factory=dict)
    rule: str = ""
    target: float | None = None
    why: str = ""  # for a claim without a result file: why not, and what it takes


@dataclass(frozen=True)
class Measured:
    """A figure read from a result file: its value and interval, the model and items, and the comparison."""

    model: str
    n: int
    value: float
    lo: float
    hi: float
    text: str
    facts: Mapping[str, float] = field(default_factory=dict)


# ---- reading the result files ------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the result file ({e})") from None


def _run(doc: Any, select: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The one run of a ``summary.json`` matching ``select`` (model, test, shots, n_items; absent keys: any)."""
    runs = doc["runs"] if isinstance(doc, dict) and "runs" in doc else doc if isinstance(doc, list) else [doc]
    keys = ("model", "test", "shots", "n_items")
    hits = [r for r in runs if all(r.get(k) == select[k] for k in keys if k in select)]
    if len(hits) != 1:
        raise InputError(f"{path}: {len(hits)} runs match {dict(select)}, want one")
    return dict(hits[0])


def heldout(path: Path, select: Mapping[str, Any]) -> Measured:
    """The k-fold held-out best of one run of a sweep report's ``summary.json`` and its baseline."""
    run = _run(_read_json(path), select, path)
    m = run["metrics"][select.get("metric", "acc")]
    kf, base = m["kfold"], float(m["baseline"])
    facts = {"baseline": base, "norm": kf["acc"] / base, "norm_lo": kf["lo"] / base, "norm_hi": kf["hi"] / base}
    text = (
        f"{run['model']}, Test {run['test']}, {run['shots']}-shot, {run['n_schemes']:,} schemes, "
        f"n={run['n_items']:,}: held out {kf['acc']:.3f} [{kf['lo']:.3f}, {kf['hi']:.3f}] vs baseline {base:.3f} "
        f"({facts['norm']:.2f} normalised)"
    )
    boot, pair = m.get("bootstrap"), m.get("paired")
    if boot:
        facts |= {"boot_norm_lo": boot["norm_lo"], "boot_norm_hi": boot["norm_hi"]}
        text += f"; bootstrap of the procedure {boot['norm_lo']:.2f}-{boot['norm_hi']:.2f} normalised"
    if pair:
        facts |= {"paired_p": pair["p"], "paired_lo": pair["lo"], "paired_hi": pair["hi"]}
        text += f"; paired vs baseline {pair['diff']:+.3f} [{pair['lo']:+.3f}, {pair['hi']:+.3f}], p={pair['p']:.2g}"
    return Measured(str(run["model"]), int(run["n_items"]), kf["acc"], kf["lo"], kf["hi"], text, facts)


def compaction(path: Path, select: Mapping[str, Any]) -> Measured:
    """From a compaction ``curves.csv``: the concept compaction keeping the most of the full run's ``acc`` at
    ``ratio``, against dropping the examples altogether (the zero-shot row)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise InputError(f"{path}: cannot read the result file ({e})") from None
    ratio = float(select["ratio"])
    concept = [r for r in rows if "method=concept" in r["spec"] and r["ratio"] == f"{ratio:.1f}"]
    zero = [r for r in rows if r["strategy"] == "zero-shot"]
    if not concept or len(zero) != 1:
        raise InputError(f"{path}: no concept compaction at ratio {ratio:g} or no zero-shot row")
    best = max(concept, key=lambda r: float(r["kept_acc"]))
    model = str(_read_json(path.with_suffix(".json")).get("model", select["model"]))
    z = zero[0]
    v, lo, hi = (float(best[k]) for k in ("kept_acc", "kept_acc_lo", "kept_acc_hi"))
    zv, zlo, zhi = (float(z[k]) for k in ("kept_acc", "kept_acc_lo", "kept_acc_hi"))
    text = (
        f"{model}, {best['shots']}-shot prefixes, n={int(best['n']):,}: best concept compaction at ratio "
        f"{ratio:g} ({best['strategy']}) keeps {v:.2f} [{lo:.2f}, {hi:.2f}] of the full run's acc; dropping the "
        f"examples keeps {zv:.2f} [{zlo:.2f}, {zhi:.2f}]"
    )
    return Measured(model, int(best["n"]), v, lo, hi, text, {"drop": zv, "drop_lo": zlo, "drop_hi": zhi})


def _below_uniform(sm: Mapping[str, Any]) -> tuple[float, int, float, float]:
    mass = [x for row in sm["mass"] for x in row]
    uni = [x for row in sm["uniform"] for x in row]
    below = sum(1 for m, u in zip(mass, uni) if m < u)
    return below / len(mass), len(mass), sum(mass) / len(mass), sum(uni) / len(uni)


def self_mass_share(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens heads --json``: the share of heads whose mean self mass is below uniform attention, as
    measured and with the attention sink removed (key 0 dropped, rows renormalised)."""
    doc = _read_json(path)
    stack = select.get("stack", "model")
    raw, n, m, u = _below_uniform(doc["self_mass"][stack])
    sink, _, ms, us = _below_uniform(doc["self_mass"][f"{stack}, position 0 removed"])
    text = (
        f"{doc.get('model', select.get('model', '?'))}, {n} heads, one text: {raw:.1%} below uniform self mass "
        f"(mean {m:.3f} vs {u:.3f}); with position 0 removed (attention-sink control) {sink:.1%} (mean {ms:.3f} "
        f"vs {us:.3f})"
    )
    return Measured(str(doc.get("model", "")), n, raw, raw, raw, text, {"sink": sink})


def alignment_counts(doc: Mapping[str, Any]) -> dict[str, float]:
    """From ``walklens power --json``'s alignment at the layer outputs: the means over layers (own v1, random
    directions, other layers' v1), the layers above each band's top and how many layers gain alignment."""
    a = doc["alignment"]
    post = [i for i, p in enumerate(a["points"]) if p.endswith(".resid_post")]
    pre = [i for i, p in enumerate(a["points"]) if p.endswith(".resid_pre")]
    n = len(post)
    return {
        "layers": n,
        "tokens": a["n_tokens"],
        "mean": sum(a["mean"][i] for i in post) / n,
        "random": sum(a["random_mean"][i] for i in post) / n,
        "other": sum(a["other_mean"][i] for i in post) / n,
        "above_random": sum(1 for i in post if a["mean"][i] > a["random_hi"][i]),
        "above_other": sum(1 for i in post if a["mean"][i] > a["other_hi"][i]),
        "gain": sum(1 for i, j in zip(post, pre) if a["mean"][i] > a["mean"][j]),
        "change": sum(a["mean"][i] - a["mean"][j] for i, j in zip(post, pre)) / n,
    }


def alignment(path: Path, select: Mapping[str, Any]) -> Measured:
    """Alignment with v1 of F through depth (seed 002), each count above a band with the number expected by
    chance (5 % of the layers: the bands are 5-95 %)."""
    from scipy.stats import binom

    doc = _read_json(path)
    c = alignment_counts(doc)
    n = int(c["layers"])
    facts = dict(c) | {
        "p_random": float(binom.sf(c["above_random"] - 1, n, BAND_ALPHA)),
        "p_other": float(binom.sf(c["above_other"] - 1, n, BAND_ALPHA)),
    }
    text = (
        f"{doc['model']}, {n} layers, {int(c['tokens'])} tokens: mean alignment at the layer output {c['mean']:.3f} "
        f"(random {c['random']:.3f}, other layers' v1 {c['other']:.3f}); above the random band "
        f"{int(c['above_random'])} of {n}, above the other-layer band {int(c['above_other'])} of {n} "
        f"({n * BAND_ALPHA:.3g} expected by chance each; P = {facts['p_random']:.2g} / {facts['p_other']:.2g} "
        "were layers independent)"
    )
    return Measured(str(doc["model"]), n, c["mean"], c["mean"], c["mean"], text, facts)


def steering_settings(doc: Mapping[str, Any]) -> dict[tuple[str, str, float], tuple[int, int, float]]:
    """From ``walklens steer --json``: per (method, layers, alpha) the prompts where the target became the most
    likely next token, the prompts, and the mean probability of the target."""
    out: dict[tuple[str, str, float], list[Mapping[str, Any]]] = {}
    for r in doc["rows"]:
        out.setdefault((r["method"], ",".join(map(str, r["layers"])), float(r["alpha"])), []).append(r)
    return {
        k: (sum(1 for r in rs if r["target_rank"] == 0), len(rs), sum(float(r["target_prob"]) for r in rs) / len(rs))
        for k, rs in out.items()
    }


def steering(path: Path, select: Mapping[str, Any]) -> Measured:
    """Eigen-steering's best setting (most prompts with the target on top, then the highest mean probability)
    next to activation addition's."""
    doc = _read_json(path)
    st = steering_settings(doc)
    best = {
        m: max((k for k in st if k[0] == m), key=lambda k: (st[k][0], st[k][2]))
        for m in ("eigen", "add")
        if any(k[0] == m for k in st)
    }
    parts = [
        f"{m} at layers {k[1]}, alpha {k[2]:g}: {st[k][0]}/{st[k][1]} prompts top-1 (mean p {st[k][2]:.3g})"
        for m, k in best.items()
    ]
    e = st[best["eigen"]]
    text = f"{doc['model_name']}, toward {doc['target_token']!r}, best of each method: " + "; ".join(parts)
    return Measured(str(doc["model_name"]), e[1], e[0], e[0], e[0], text, {"eigen_top1": e[0], "prompts": e[1]})


MEASURES: dict[str, Callable[[Path, Mapping[str, Any]], Measured]] = {
    "steering": steering,
    "alignment": alignment,
    "heldout": heldout,
    "compaction": compaction,
    "self_mass": self_mass_share,
}


# ---- verdict rules -------------------------------------------------------------------------------------------------


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
        return f"reproduced on these {n} prompts: eigen-steering puts the target on top of every one"
    if k == 0:
        return "not reproduced: eigen-steering puts the target on top of no prompt at any tried setting"
    return f"partly: eigen-steering puts the target on top of {k} of {n} prompts at its best tried setting"


RULES: dict[str, Callable[[Measured, float | None], str]] = {
    "steer": _steer,
    "tilt": _tilt,
    "sink": _sink,
    "below_baseline": _below_baseline,
    "reaches": _reaches,
    "above_chance": _above_chance,
    "compaction": _compaction,
}


# ---- seed 000 A.2 (self-bias counts), Fig. 9 (c_t near w_t), footnote 12 (concept-level evaluation) -----------


def self_bias(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens kernels --sink-control --json``: heads with negative self-bias, flagged at the margin and
    below zero by a one-sided t-test (with the number chance gives), as measured and with position 0 removed."""
    doc = _read_json(path)
    a, b = (doc["self_bias"][k][0] for k in ("as measured", "position 0 removed"))
    n = int(a["heads"])
    text = (
        f"{doc['model']}, {n} empirical kernels: {a['negative']} ({a['negative'] / n:.1%}) flagged at "
        f"{a['margin']:g} nats, {a['significant']} below zero at one-sided {a['alpha']:g} ({a['expected']:.3g} "
        f"by chance); with position 0 removed {b['negative']} ({b['negative'] / n:.1%}) and {b['significant']} "
        f"({b['expected']:.3g} by chance)"
    )
    facts = {"sink": b["negative"] / n, "sig": a["significant"], "sig_sink": b["significant"],
             "expected": a["expected"], "p_sink": b["p_chance"]}  # fmt: skip
    v = a["negative"] / n
    return Measured(str(doc["model"]), n, v, v, v, text, facts)


def self_rank(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens walk --self-rank --json``: per stack the own token's median rank and the share of
    positions where it outranks another position's token."""
    doc = _read_json(path)
    st = {s["stack"] or "model": s for s in doc["stacks"]}
    parts = [
        f"{k}: own token median rank {s['summary']['median_rank_own']:g} of {s['vocab']} (control "
        f"{s['summary']['median_rank_control']:g}), ahead of the control at {s['closer']:.0%} "
        f"[{s['closer_lo']:.0%}, {s['closer_hi']:.0%}] of {len(s['token_ids'])} positions"
        for k, s in st.items()
    ]
    e = st.get("enc") or next(iter(st.values()))
    note = f" ({select['note']})" if "note" in select else ""
    facts = {"encoder": float(bool(doc["encoder_decoder"])), "trained": float(select.get("trained", 1))}
    text = f"{doc['model']}{note}: " + "; ".join(parts)
    return Measured(str(doc["model"]), len(e["token_ids"]), e["closer"], e["closer_lo"], e["closer_hi"], text, facts)


def concept_eval(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens hellaswag concept-eval --json``: each comparison's share with its interval."""
    doc = _read_json(path)
    cs = doc["comparisons"]
    parts = [f"{k} {c['share']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}] (chance {c['chance']:g})" for k, c in cs.items()]
    o = cs["own_vs_offtopic"]
    facts = {f"{k}_{x}": float(c[x]) for k, c in cs.items() for x in ("lo", "hi")}
    text = f"{doc['model']}, n={doc['n_items']} HellaSwag items: " + "; ".join(parts)
    return Measured(str(doc["model"]), int(doc["n_items"]), o["share"], o["lo"], o["hi"], text, facts)


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


MEASURES.update(self_bias=self_bias, self_rank=self_rank, concept_eval=concept_eval)
RULES.update(self_bias=_self_bias, self_rank=_self_rank, concept_eval=_concept_eval)


# ---- the registry ----------------------------------------------------------------------------------------------------

_DB = "--db $DB --cache $C"  # docs/sweep.md: scratch database and concept cache
_REPORT = "walklens report --db $DB --out docs/results/report"
_FULL = (
    "walklens hellaswag sweep --test 2 --grid full --model smollm2-135m --db $DB --cache concepts && "
    "walklens report --db $DB --out docs/results/report_full"
)
_T1_GRID = {
    ("smollm2-135m", 0): "test1_grid_1100.toml",
    ("smollm2-135m", 5): "test1_grid_hour_smollm2_5shot.toml",
    ("gemma3-270m", 0): "test1_grid_hour_gemma3_0shot.toml",
    ("gemma3-270m", 5): "test1_grid_hour_gemma3_5shot.toml",
}
_S000_T2 = (
    "000 sec. 5.1.1, Fig. 10b: the best Test 2 (concept similarity) scheme scores 82.6% / 80.5% of the ordinary run"
)
_S000_T1 = (
    "000 sec. 5.1.1, Fig. 10a: the best Test 1 (concept generation) scheme scores 84.5% / 84.9% of the ordinary run"
)


def _sweep_claims() -> list[Claim]:
    out = [
        Claim("T2-best-full", _S000_T2 + " (0 / 5-shot)", "Test 2 best reaches ~0.81 normalised", _FULL,
              "docs/results/report_full/summary.json", "heldout", {"test": 2, "shots": 0, "n_items": 10042},
              "reaches", 0.826),
        Claim("T2-below-full", _S000_T2, "Test 2 stays below the ordinary run", _FULL,
              "docs/results/report_full/summary.json", "heldout", {"test": 2, "shots": 0, "n_items": 10042},
              "below_baseline"),
        Claim("T2-above-chance-full", _S000_T2, "Test 2's best scheme is above chance", _FULL,
              "docs/results/report_full/summary.json", "heldout", {"test": 2, "shots": 0, "n_items": 10042},
              "above_chance"),
    ]  # fmt: skip
    for model, shots, target in (("smollm2-135m", 0, 0.826), ("gemma3-270m", 0, 0.826), ("smollm2-135m", 5, 0.805),
                                 ("gemma3-270m", 5, 0.805)):  # fmt: skip
        sel = {"model": model, "test": 2, "shots": shots, "n_items": 200}
        out.append(Claim(f"T2-best-{model}-{shots}shot-200", _S000_T2, "Test 2 best reaches ~0.81 normalised",
                         f"walklens hellaswag sweep --test 2 --grid full --model {model} --limit 200 --shots {shots} "
                         f"{_DB} && {_REPORT}",
                         "docs/results/report/summary.json", "heldout", sel, "reaches", target))  # fmt: skip
    for model, shots, target in (("smollm2-135m", 0, 0.845), ("gemma3-270m", 0, 0.845), ("smollm2-135m", 5, 0.849),
                                 ("gemma3-270m", 5, 0.849)):  # fmt: skip
        sel = {"model": model, "test": 1, "shots": shots, "n_items": 200}
        cmd = (f"walklens hellaswag sweep --test 1 --limit 200 {_DB} --model {model} --shots {shots} "
               f"--grid docs/results/{_T1_GRID[model, shots]} && {_REPORT}")  # fmt: skip
        out.append(Claim(f"T1-best-{model}-{shots}shot-200", _S000_T1, "Test 1 best reaches ~0.85 normalised",
                         cmd, "docs/results/report/summary.json", "heldout", sel, "reaches", target))  # fmt: skip
        out.append(Claim(f"T1-below-{model}-{shots}shot-200", _S000_T1, "Test 1 stays below the ordinary run",
                         cmd, "docs/results/report/summary.json", "heldout", sel, "below_baseline"))  # fmt: skip
    bf16 = "docs/results/test1_full_bf16/report/summary.json"
    for shots in (0, 5):
        sel = {"model": "smollm2-135m@bfloat16", "test": 1, "shots": shots, "n_items": 200}
        cmd = (f"walklens hellaswag sweep --test 1 --grid full --model smollm2-135m --dtype bfloat16 --limit 200 "
               f"--shots {shots} --db t1.sqlite --cache t1cache --backend ray --workers 2 && "
               f"walklens report --db t1.sqlite --out {bf16.rsplit('/', 1)[0]}")  # fmt: skip
        out.append(Claim(f"T1-below-full-grid-bf16-{shots}shot-200", _S000_T1,
                         "Test 1 stays below the ordinary run (4,400 schemes)", cmd, bf16, "heldout", sel,
                         "below_baseline"))  # fmt: skip
    t1 = (
        "walklens hellaswag sweep --test 1 --grid docs/results/test1_grid_1100.toml --model smollm2-135m --db t1.sqlite"
    )
    why = "never run on all 10,042 items (the 200-item runs' cost: docs/results/test1_full_bf16); needs a GPU or Ray"
    out.append(Claim("T1-best-full-set", _S000_T1, "Test 1 best on all 10,042 items", t1, why=why))
    return out


def _other_claims() -> list[Claim]:
    out = []
    for model, shots in (("smollm2", 5), ("smollm2", 10), ("gemma3", 5), ("gemma3", 10)):
        cmd = (
            f"walklens hellaswag compaction --model {model}-{SIZE[model]} --shots 5,10 --what examples,context "
            f"--limit 1000 --tune 200 --db $OUT/compaction.sqlite --cache $OUT/concepts --out $OUT/compaction-{model} "
            f"--json $OUT/{model}.json"
        )
        out.append(Claim(
            f"compaction-{model}-{shots}shot", "000 footnote 11: concept vectors can compact long contexts",
            "context compacted into concept vectors keeps the task", cmd,
            f"docs/results/compaction_{model}_{shots}shot/curves.csv", "compaction", {"model": model, "ratio": 8},
            "compaction"))  # fmt: skip
    missing = [
        ("power-alignment-gemma3", "002: tokens align with the principal eigenvector v1 of F = W_V W_O through depth",
         "walklens power TEXTS... --model gemma3-270m --shared-layer 9 --shared-depth 18 --skip-first "
         "--json docs/results/power_gemma3.json",
         "gemma3-270m's weights package is not installed on this machine; docs/power.md's Gemma 3 row has no file"),
        ("shared-weights", "002: trained shared-weight models converge to v1 at rate |lambda2/lambda1|",
         "walklens power --model M --shared-layer L --json shared.json",
         "untested: docs/power.md repeats one layer of a model never trained to repeat it; ALBERT (the one trained "
         "shared-weight family) has no weights reachable here"),
        ("eigen-steering-gemma3", "002: a rank-one edit along v1 steers the output toward an arbitrary direction",
         "walklens steer PROMPTS... --toward ' Paris' --model gemma3-270m --json docs/results/steer_gemma3.json",
         "gemma3-270m's weights package is not installed on this machine; docs/power.md's Gemma 3 table has no file"),
        ("similarity-cooccurrence", "000 Result 4: similarity <-> co-occurrence <-> angular proximity", "-",
         "no command measures it yet"),
        ("similarity-maps", "000 Figs. 3, 11, 12: similarity maps show blocks (numbers, brackets alike)",
         "walklens simmap", "read by eye; no number is computed from the maps yet"),
    ]  # fmt: skip
    out.append(Claim(
        "power-alignment-smollm2", "002: tokens align with the principal eigenvector v1 of F = W_V W_O through depth",
        "passing through a layer, tokens tilt toward v1 of the layer's F",
        "walklens power TEXTS... --model smollm2-135m --shared-layer 15 --shared-depth 30 --skip-first "
        "--json docs/results/power_smollm2.json (TEXTS: the eight texts of docs/power.md)",
        "docs/results/power_smollm2.json", "alignment", {}, "tilt"))  # fmt: skip
    out.append(Claim(
        "eigen-steering-smollm2", "002: a rank-one edit along v1 steers the output toward an arbitrary direction",
        "eigen-steering makes an arbitrary token the next one",
        "walklens steer PROMPTS... --toward ' Paris' --layers 5,10,15 --layers 20 --alpha=-3000,-1000,0,1000,3000 "
        "--add-alpha 0,50,100,200 --max-new-tokens 8 --model smollm2-135m --json docs/results/steer_smollm2.json "
        "(PROMPTS: the five prompts of docs/power.md)",
        "docs/results/steer_smollm2.json", "steering", {}, "steer"))  # fmt: skip
    out.append(Claim(
        "low-self-mass", "000 A.2: a query attends to itself less than to its context (read as negative self-bias)",
        "most heads put less mass on the query itself than uniform attention",
        'walklens heads "The capital of France is Paris, and the river that runs through it is the Seine." '
        "--maps -1 --json docs/results/heads_smollm2_sink.json", "docs/results/heads_smollm2_sink.json", "self_mass",
        {"model": "smollm2-135m"}, "sink"))  # fmt: skip
    out += [Claim(i, s, s.split(": ", 1)[1], c, why=w) for i, s, c, w in missing]
    out += _walk_claims()
    return out


_TEXT9 = (
    "the king ran to the river and the queen of france was in paris with her dog and his cat by the house in the city"
)


def _walk_claims() -> list[Claim]:
    """Seed 000 A.2 (kernels), Fig. 9 and footnote 12, each with its committed file."""
    return [
        *(Claim(f"negative-self-bias{'' if m == 'smollm2' else '-' + m}",
                "000 A.2, Figs. 5-8: position kernels with negative self-bias", "heads attenuate the query's own "
                "position", f"walklens kernels --model {m}-{SIZE[m]} --sink-control --json "
                f"docs/results/kernels_{m}.json", f"docs/results/kernels_{m}.json", "self_bias", {}, "self_bias")
          for m in ("smollm2", "gemma3")),
        Claim("encoder-fig9", "000 Fig. 9, A.2: an encoder's c_t stays near w_t", "c_t ranks w_t high",
              f'walklens walk "{_TEXT9}" --model t5-random... --self-rank --json '
              "docs/results/selfrank_t5_random.json (t5-random: walklens.testing.tiny_model('t5') saved by "
              "save_pretrained, docs/walks.md)", "docs/results/selfrank_t5_random.json", "self_rank",
              {"trained": 0, "note": "random weights: proves the command runs"}, "self_rank"),
        Claim("concept-walk-eval", "000 Property 2, footnote 12: a concept-level walk to evaluate a model's output",
              "the concept score of a continuation tells own from off-topic", "walklens hellaswag concept-eval "
              "--model smollm2-135m --limit 100 --json docs/results/concept_eval_smollm2.json",
              "docs/results/concept_eval_smollm2.json", "concept_eval", {}, "concept_eval"),
    ]  # fmt: skip


CLAIMS: tuple[Claim, ...] = (*_sweep_claims(), *_other_claims())


# ---- the table -----------------------------------------------------------------------------------------------------


#: where ``walklens reproduce --quick`` writes the sweep report it reads (relative to its ``--out``)
QUICK_SUMMARY = "report/summary.json"


@dataclass(frozen=True)
class Source:
    """Where a claim's figure is read from in one rendering: a file (relative to the root) and the run selection,
    or ``None`` with the reason it was not run."""

    file: str | None
    select: Mapping[str, Any]
    skipped: str = ""


def committed(c: Claim) -> Source:
    """The committed result file of a claim (docs/claims.md)."""
    return Source(c.file, c.select)


def quick(c: Claim) -> Source:
    """``reproduce --quick``: every zero-shot held-out claim read from the quick sweep's report (its one run of
    that test); the rest are not run by ``--quick``."""
    if c.measure == "heldout" and c.select.get("shots") == 0:
        return Source(QUICK_SUMMARY, {"test": c.select["test"], "shots": 0, "metric": c.select.get("metric", "acc")})
    return Source(None, {}, "not run by --quick (5-shot, compaction or no command)" if c.file else "")


def assess(claim: Claim, root: Path, src: Source | None = None) -> tuple[Measured | None, str]:
    """The claim's figure read from its result file (``src``: another source, for ``reproduce``) and its verdict."""
    src = src or committed(claim)
    if src.file is None:
        return None, src.skipped or f"not measured yet: {claim.why}"
    p = root / src.file
    if not p.is_file():
        return None, f"not measured yet: {src.file} is missing"
    m = MEASURES[claim.measure](p, src.select)
    return m, RULES[claim.rule](m, claim.target)


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render(
    root: Path, claims: Sequence[Claim] = CLAIMS, source: Callable[[Claim], Source] = committed, title: str = ""
) -> str:
    """docs/claims.md: one row per claim, every number read from the result file its ``source`` names (relative
    to ``root``)."""
    lines = [
        title or "# Claims of both seeds, measured",
        "",
        "<!-- generated by walklens reproduce --render; every number below is read from the result file of its row "
        "(tests/test_claims.py re-renders it) -->",
        "",
        "Rendered by `walklens reproduce --render --out docs` from the committed result files (the registry: "
        "`src/walklens/claims.py`). A verdict says no more than its interval allows: where a file holds no paired "
        "test or bootstrap of the held-out best (the sweep databases are not committed), a held-out interval that "
        'holds the baseline or the seed\'s figure is "not decided".',
        "",
        "| claim | seed says | walklens measured (model, n, interval) | verdict | command | file |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in claims:
        src = source(c)
        m, verdict = assess(c, root, src)
        lines.append(
            f"| {c.id} | {_cell(c.seed)} | {_cell(m.text if m else '-')} | {_cell(verdict)} | `{_cell(c.command)}` "
            f"| {src.file or '-'} |"
        )
    return "\n".join(lines) + "\n"


__all__ = ["CLAIMS", "QUICK_SUMMARY", "Claim", "Measured", "Source", "assess", "committed", "quick", "render"]
