"""Reading the committed result files: each reader turns one file (and a run selection) into a :class:`Measured`.

Every value a reader uses is checked against its document's declared schema (:mod:`.schemas`) as it is read:
a bad file is one :class:`~walklens.base.errors.InputError` line naming the file, the row or key path and the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import walklens.lab.claims.schemas as sc  # the module, not the package (whose __init__ imports this one)

from ...base.errors import InputError
from ...base.numbers import Range
from ..experiments.heldout import corrected
from ..steeringcard import CardChoice, SteeringCard
from .base import BAND_ALPHA, CARD_CONTROL, CARD_OTHERS, Measured
from .pairs import fold_picks, scheme_picks, selection_picks

# ---- reading the result files ------------------------------------------------------------------------------------


def _run(path: Path, select: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The one run of a ``summary.json`` matching ``select`` (model, test, shots, n_items; absent keys: any), every
    run checked; with the run's place in messages."""
    doc = sc.load_json(path)
    runs = doc["runs"] if isinstance(doc, dict) and "runs" in doc else doc if isinstance(doc, list) else [doc]
    checked = sc.SWEEP_RUN.check_all(runs, str(path), sc.MAX_ROWS)
    keys = ("model", "test", "shots", "n_items")
    hits = [(i, r) for i, r in enumerate(checked) if all(r.get(k) == select[k] for k in keys if k in select)]
    if len(hits) != 1:
        raise InputError(f"{path}: {len(hits)} runs match {dict(select)}, want one")
    return f"{path} row {hits[0][0]}", hits[0][1]


def _paired(doc: Any, where: str) -> dict[str, Any]:
    """A paired test against the baseline (``diff`` inside its interval, ``p`` a probability)."""
    pair = sc.PAIRED.check(doc, where)
    sc.ordered(pair, where, "lo", "diff", "hi")
    return pair


def heldout(path: Path, select: Mapping[str, Any]) -> Measured:
    """The k-fold held-out best of one run of a sweep report's ``summary.json`` and its baseline."""
    where, run = _run(path, select)
    metric = select.get("metric", "acc")
    m = sc.key(run["metrics"], metric, f"{where} metrics", "metric")
    where += f" metrics.{metric}"
    m = sc.SWEEP_METRIC.check(m, where)
    kf, base = sc.KFOLD.check(m["kfold"], where + ".kfold"), m["baseline"]
    sc.ordered(kf, where + ".kfold", "lo", "acc", "hi")
    facts = {"baseline": base, "norm": kf["acc"] / base, "norm_lo": kf["lo"] / base, "norm_hi": kf["hi"] / base}
    cc = [corrected(x, base) for x in (kf["acc"], kf["lo"], kf["hi"])]
    facts |= {"cc": cc[0], "cc_lo": cc[1], "cc_hi": cc[2]}
    text = (
        f"{run['model']}, Test {run['test']}, {run['shots']}-shot, {run['n_schemes']:,} schemes, "
        f"n={run['n_items']:,}: held out {kf['acc']:.3f} [{kf['lo']:.3f}, {kf['hi']:.3f}] vs baseline {base:.3f} "
        f"({facts['norm']:.2f} normalised, chance-corrected {cc[0]:.2f} [{cc[1]:.2f}, {cc[2]:.2f}] with the "
        "baseline as a point: no per-item picks committed)"
    )
    boot, pair = m.get("bootstrap"), m.get("paired")
    if boot:
        boot = sc.BOOTSTRAP.check(boot, where + ".bootstrap")
        sc.ordered(boot, where + ".bootstrap", "norm_lo", "norm_hi")
        facts |= {"boot_norm_lo": boot["norm_lo"], "boot_norm_hi": boot["norm_hi"]}
        text += f"; bootstrap of the procedure {boot['norm_lo']:.2f}-{boot['norm_hi']:.2f} normalised"
    if pair:
        pair = _paired(pair, where + ".paired")
        facts |= {"paired_p": pair["p"], "paired_lo": pair["lo"], "paired_hi": pair["hi"]}
        text += f"; paired vs baseline {pair['diff']:+.3f} [{pair['lo']:+.3f}, {pair['hi']:+.3f}], p={pair['p']:.2g}"
    return Measured(str(run["model"]), int(run["n_items"]), kf["acc"], kf["lo"], kf["hi"], text, facts)


def standard(path: Path, select: Mapping[str, Any]) -> Measured:
    """The standard scheme (sec. 5.1) of one run of a sweep report's ``summary.json``: its accuracy (Wilson) and
    both ratios, the baseline as a point (the report keeps no picks of it)."""
    from ...analyses.chance import wilson

    where, run = _run(path, select)
    metric = select.get("metric", "acc")
    m = sc.SWEEP_METRIC.check(sc.key(run["metrics"], metric, f"{where} metrics", "metric"), where)
    std = sc.STANDARD.check(sc.key(m, "standard", where, "key"), f"{where} standard")
    n, acc, base = int(run["n_items"]), float(std["acc"]), float(m["baseline"])
    lo, hi = wilson(round(acc * n), n)
    cc = [corrected(x, base) for x in (acc, lo, hi)]
    facts = {"baseline": base, "norm": acc / base, "norm_lo": lo / base, "norm_hi": hi / base}
    facts |= {"cc": cc[0], "cc_lo": cc[1], "cc_hi": cc[2]}
    text = (
        f"{run['model']}, Test {run['test']}, {run['shots']}-shot, the standard scheme, n={n:,}: {acc:.3f} "
        f"[{lo:.3f}, {hi:.3f}] vs baseline {base:.3f} ({acc / base:.2f} normalised, chance-corrected {cc[0]:.2f} "
        f"[{cc[1]:.2f}, {cc[2]:.2f}] with the baseline as a point: no per-item picks committed)"
    )
    return Measured(str(run["model"]), n, acc, lo, hi, text, facts)


def unique(path: Path, select: Mapping[str, Any]) -> Measured:
    """Whether each model's best scheme is its own: per (test, shots) of a sweep report, the in-sample best of each
    model and how many distinct schemes its k folds chose (the selection's own noise)."""
    doc = sc.load_json(path)
    runs = sc.SWEEP_RUN.check_all(doc if isinstance(doc, list) else [], str(path), sc.MAX_ROWS)
    best: dict[tuple[int, int], dict[str, tuple[str, int]]] = {}
    for i, r in enumerate(runs):
        m = sc.SWEEP_METRIC.check(sc.key(r["metrics"], "acc", f"{path} row {i}", "metric"), f"{path} row {i}")
        ins = sc.key(m, "in_sample", f"{path} row {i}", "key")
        folds = sc.key(m["kfold"], "fold_schemes", f"{path} row {i} kfold", "key")
        if not isinstance(ins, dict) or not isinstance(folds, list):
            raise InputError(f"{path} row {i}: in_sample and kfold.fold_schemes must be an object and a list")
        per = best.setdefault((int(r["test"]), int(r["shots"])), {})
        per[str(r["model"])] = (str(ins.get("scheme")), len(set(map(str, folds))))
    pairs = {k: v for k, v in best.items() if len(v) == 2}
    differ = sum(1 for v in pairs.values() if len({s for s, _ in v.values()}) == 2)
    unstable = sum(1 for v in pairs.values() for _, k in v.values() if k > 1)
    facts = {"pairs": len(pairs), "differ": differ, "unstable": unstable}
    text = (
        f"{len(pairs)} (test, shots) with both models, 200 items each: the in-sample best schemes differ between the "
        f"models in {differ} of {len(pairs)}; in {unstable} of {2 * len(pairs)} runs the 5 folds chose more than one "
        "scheme"
    )
    return Measured("smollm2-135m, gemma3-270m", 200, differ, differ, differ, text, facts)


_RATIO = Range(0, open_lo=True, what="a positive number or max")


def _ratio(r: Mapping[str, Any], where: str) -> float | None:
    """A compaction point's ratio: none (the zero-shot and full rows), ``max`` (one vector) or a number."""
    cell = r["ratio"]
    if cell is None or cell == "max":
        return math.inf if cell else None
    try:
        return float(_RATIO.parse(cell, "field 'ratio'"))
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def _concept_name(spec: str) -> str:
    """What a compaction's concept vectors are: the layer-E mean of a segment is average pooling of its token
    embeddings (the average-pooling baseline's vectors), named so."""
    parts = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
    if parts.get("layer") == "E" and parts.get("word") == "mean":
        return "the layer-E mean: average pooling of the token embeddings"
    return f"layer {parts.get('layer', '?')}, {parts.get('word', '?')}"


def compaction(path: Path, select: Mapping[str, Any]) -> Measured:
    """From a compaction ``curves.csv``: the concept compaction keeping the most of the full run's ``metric``
    (``select``; docs/compaction.md reads ``acc_norm``) at ``ratio`` (a NaN share is never ranked), against
    dropping the examples altogether (the zero-shot row); the overall input ratio counts verbatim tokens."""
    metric = str(select.get("metric", "acc"))
    k = f"kept_{metric}"
    rows = sc.read_csv(path, sc.COMPACTION_POINT)
    for where, r in rows:
        if r.get(k) is None:
            raise InputError(f"{where}: no field {k!r}")
        for x in {"kept_acc", k}:  # every interval read is checked, the acc one always
            sc.ordered(r, where, f"{x}_lo", x, f"{x}_hi")
        r["ratio"] = _ratio(r, where)
    ratio = float(select["ratio"])
    concept = [r for _, r in rows if "method=concept" in r["spec"] and r["ratio"] == ratio]
    zero = [r for _, r in rows if r["strategy"] == "zero-shot"]
    if not concept or len(zero) != 1:
        raise InputError(f"{path}: no concept compaction at ratio {ratio:g} or no zero-shot row")
    ranked = [r for r in concept if not math.isnan(r[k])]
    if not ranked:
        raise InputError(f"{path}: every concept compaction at ratio {ratio:g} keeps NaN of the full run's {metric}")
    best = max(ranked, key=lambda r: float(r[k]))
    json_path = path.with_suffix(".json")
    model = str(sc.COMPACTION_DOC.check(sc.load_json(json_path), str(json_path)).get("model", select["model"]))
    z = zero[0]
    v, lo, hi = (float(best[x]) for x in (k, f"{k}_lo", f"{k}_hi"))
    zv, zlo, zhi = (float(z[x]) for x in (k, f"{k}_lo", f"{k}_hi"))
    inputs, full = best.get("inputs"), best.get("inputs_full")
    overall = (
        f"; {inputs:.1f} of {full:.1f} input positions per item ({full / inputs:.1f}x overall, verbatim tokens counted)"
        if inputs and full and not math.isnan(inputs) and inputs > 0
        else ""
    )
    text = (
        f"{model}, {best['shots']}-shot prefixes, n={int(best['n']):,}, {metric}: best concept compaction at "
        f"{ratio:g} tokens per vector ({best['strategy']}; {_concept_name(best['spec'])}) keeps {v:.2f} "
        f"[{lo:.2f}, {hi:.2f}] of the full run's {metric}{overall}; dropping the examples keeps {zv:.2f} "
        f"[{zlo:.2f}, {zhi:.2f}]"
    )
    return Measured(model, int(best["n"]), v, lo, hi, text, {"drop": zv, "drop_lo": zlo, "drop_hi": zhi})


def _below_uniform(sm: Mapping[str, Any], where: str = "self mass") -> tuple[float, int, float, float]:
    sm = sc.SELF_MASS.check(sm, where)
    mass, uni = (sc.numbers(sm[k], sc.ACC, where, k, depth=2) for k in ("mass", "uniform"))
    if not mass or len(mass) != len(uni):
        raise InputError(f"{where}: fields 'mass' and 'uniform' hold {len(mass)} and {len(uni)} heads, want as many")
    below = sum(1 for m, u in zip(mass, uni) if m < u)
    return below / len(mass), len(mass), sum(mass) / len(mass), sum(uni) / len(uni)


def self_mass_share(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens heads --json``: the share of heads whose mean self mass is below uniform attention, as
    measured and with the attention sink removed (key 0 dropped, rows renormalised)."""
    doc = sc.SELF_MASS_DOC.check(sc.load_json(path), str(path))
    stack, where = select.get("stack", "model"), f"{path} self_mass"
    raw, n, m, u = _below_uniform(sc.key(doc["self_mass"], stack, where, "stack"), f"{where}.{stack}")
    removed = f"{stack}, position 0 removed"
    sink, _, ms, us = _below_uniform(sc.key(doc["self_mass"], removed, where, "stack"), f"{where}.{removed}")
    text = (
        f"{doc.get('model', select.get('model', '?'))}, {n} heads, one text: {raw:.1%} below uniform self mass "
        f"(mean {m:.3f} vs {u:.3f}); with position 0 removed (attention-sink control) {sink:.1%} (mean {ms:.3f} "
        f"vs {us:.3f})"
    )
    return Measured(str(doc.get("model", "")), n, raw, raw, raw, text, {"sink": sink})


def alignment_counts(doc: Mapping[str, Any], where: str = "power document") -> dict[str, float]:
    """From ``walklens power --json``'s alignment at the layer outputs: the means over layers (own v1, random
    directions, other layers' v1), the layers above each band's top and how many layers gain alignment."""
    a = sc.key(doc, "alignment", where, "key")
    where += " alignment"
    a = sc.ALIGNMENT.check(a, where)
    points = a["points"]
    if not all(isinstance(p, str) for p in points):
        raise InputError(f"{where}: field 'points' must be a list of strings")
    s = {k: sc.numbers(a[k], sc.DIFF, where, k) for k in sc.ALIGNMENT_SERIES}
    short = next((k for k in sc.ALIGNMENT_SERIES if len(s[k]) != len(points)), None)
    if short:
        raise InputError(f"{where}: field {short!r} holds {len(s[short])} numbers for {len(points)} points")
    post = [i for i, p in enumerate(points) if p.endswith(".resid_post")]
    pre = [i for i, p in enumerate(points) if p.endswith(".resid_pre")]
    n = len(post)
    if not n:
        raise InputError(f"{where}: no layer output (a point named L<i>.resid_post)")
    mean = s["mean"]
    return {
        "layers": n,
        "tokens": a["n_tokens"],
        "mean": sum(mean[i] for i in post) / n,
        "random": sum(s["random_mean"][i] for i in post) / n,
        "other": sum(s["other_mean"][i] for i in post) / n,
        "above_random": sum(1 for i in post if mean[i] > s["random_hi"][i]),
        "above_other": sum(1 for i in post if mean[i] > s["other_hi"][i]),
        "gain": sum(1 for i, j in zip(post, pre) if mean[i] > mean[j]),
        "change": sum(mean[i] - mean[j] for i, j in zip(post, pre)) / n,
    }


def alignment(path: Path, select: Mapping[str, Any]) -> Measured:
    """Alignment with v1 of F through depth (seed 002), each count above a band with the number expected by
    chance (5 % of the layers: the bands are 5-95 %)."""
    from scipy.stats import binom

    doc = sc.ALIGNMENT_DOC.check(sc.load_json(path), str(path))
    c = alignment_counts(doc, str(path))
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


def steering_settings(
    doc: Mapping[str, Any], where: str = "steering document"
) -> dict[tuple[str, str, float], tuple[int, int, float]]:
    """From ``walklens steer --json``: per (method, layers, alpha) the prompts where the target became the most
    likely next token, the prompts, and the mean probability of the target (NaN where a probability is)."""
    out: dict[tuple[str, str, float], list[Mapping[str, Any]]] = {}
    for i, r in enumerate(sc.STEER_ROW.check_all(sc.key(doc, "rows", where, "key"), where, sc.MAX_ROWS)):
        layers = sc.numbers(r["layers"], sc.LAYER, f"{where} row {i}", "layers")
        out.setdefault((r["method"], ",".join(str(int(x)) for x in layers), r["alpha"]), []).append(r)
    return {
        k: (sum(1 for r in rs if r["target_rank"] == 0), len(rs), sum(float(r["target_prob"]) for r in rs) / len(rs))
        for k, rs in out.items()
    }


def _chosen(card: SteeringCard, path: Path) -> dict[str, CardChoice]:
    """Each method's choice of the card's one kind of target (its cell chosen on ``choose``, measured on
    ``heldout``), every method a verdict reads present."""
    kinds = {c.kind for c in card.choices}
    if len(kinds) != 1:
        raise InputError(f"{path}: want the choices of one kind of target, not {sorted(kinds)}")
    got = {c.method: c for c in card.choices}
    missing = [m for m in ("eigen", CARD_CONTROL, *CARD_OTHERS) if m not in got]
    if missing:
        raise InputError(f"{path}: no choice for method(s) {', '.join(missing)}")
    return got


def steering_card(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens steer --card SET --json`` (the held-out steering card, docs/power.md): each method's cell
    chosen on ``choose`` within the perplexity budget, measured on ``heldout``: eigen-steering's mean effect with
    its interval, beside the projection-ablation control's and the larger of the other two methods' (NaN where no
    cell of a method was within the budget)."""
    card = SteeringCard.from_document(sc.load_json(path))
    got = _chosen(card, path)

    def effect(m: str) -> tuple[float, float, float]:
        h = got[m].heldout
        return (math.nan,) * 3 if h is None else (h.effect.value, h.effect.lo, h.effect.hi)

    def shown(m: str) -> str:
        c, h = got[m], got[m].heldout
        if h is None:
            return f"{m}: no cell within the budget"
        where = f"L{c.layer}" + ("" if m == CARD_CONTROL else f" dose {c.dose:g}")
        e = h.effect
        return f"{m} {where} {e.value:+.2f} [{e.lo:+.2f}, {e.hi:+.2f}] (log ppl {h.log_ppl.value:.2f})"

    value, lo, hi = effect("eigen")
    means = [effect(m)[0] for m in CARD_OTHERS]
    other = max(range(len(CARD_OTHERS)), key=lambda i: -math.inf if math.isnan(means[i]) else means[i])
    h = got["eigen"].heldout
    n = 0 if h is None else h.effect.n
    shows = "; ".join(shown(m) for m in ("eigen", *CARD_OTHERS, CARD_CONTROL))
    text = f"{card.model_name}, {card.set_name} targets, held out (n={n}): {shows}"
    _, o_lo, o_hi = effect(CARD_OTHERS[other])
    _, c_lo, c_hi = effect(CARD_CONTROL)
    facts = {"other": float(other), "other_lo": o_lo, "other_hi": o_hi, "control_lo": c_lo, "control_hi": c_hi}
    return Measured(card.model_name, n, value, lo, hi, text, facts)


def cooccur(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens cooccur --json``: Spearman PMI-cosine with its interval, the other two sides of Result 4's
    triangle and both frequency controls (seed 000, sec. 2.2)."""
    d = sc.COOCCUR.check(sc.load_json(path), str(path))
    for k in sc.COOCCUR_STATS:
        d[k] = sc.CORRELATION.check(d[k], f"{path} {k}")
        sc.ordered(d[k], f"{path} {k}", "lo", "rho", "hi")
    f = {f"{k}{s}": float(d[k][j]) for k in sc.COOCCUR_STATS for s, j in (("", "rho"), ("_lo", "lo"), ("_hi", "hi"))}

    def ci(k: str) -> str:
        return f"{f[k]:+.3f} [{f[k + '_lo']:+.3f}, {f[k + '_hi']:+.3f}]"

    text = (
        f"{d['model_name']}, {d['n_pairs']:,} token pairs (within {d['window']} tokens, seen >= {d['min_count']} "
        f"times) in {d['n_tokens']:,} tokens of HellaSwag; Spearman vs PMI: cosine {ci('pmi_cos')}, inner product "
        f"{ci('pmi_dot')}; inner product vs cosine {f['dot_cos']:+.3f}; controls: given both log frequencies "
        f"{ci('partial_cos')}, partner swapped for a frequency-matched token {f['matched_cos']:+.3f} (excess "
        f"{ci('excess_cos')}); jackknife over {d['n_groups']} groups of {d['n_clusters']} activity labels"
    )
    return Measured(str(d["model_name"]), int(d["n_pairs"]), f["pmi_cos"], f["pmi_cos_lo"], f["pmi_cos_hi"], text, f)


def _classes(maps: Mapping[str, Any], path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Per map, its class contrasts by class (the three a claim reads must be there)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for k, m in maps.items():
        where = f"{path} maps.{sc.name(k)}"
        cs = sc.BLOCK_CLASS.check_all(sc.BLOCK_MAP.check(m, where)["classes"], f"{where} classes", sc.MAX_ROWS)
        for i, c in enumerate(cs):
            sc.ordered(c, f"{where} classes row {i}", "lo", "hi")
        out[k] = {c["cls"]: c for c in reversed(cs)}  # the first of a repeated class, as a search finds it
        missing = next((c for c in ("number", "bracket", "separator") if c not in out[k]), None)
        if missing:
            raise InputError(f"{where}: no class {missing!r}")
    return out


def blocks(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens simmap --blocks``: per class, in how many maps the class is alike (within above between
    beyond the permutation null, Bonferroni over the maps), and the contrast of ``select['map']``."""
    d = sc.BLOCKS_DOC.check(sc.load_json(path), str(path))
    if not d["maps"]:
        raise InputError(f"{path}: field 'maps' holds no map")
    maps = _classes(d["maps"], path)
    chosen = sc.key(maps, select["map"], str(path), "map")
    alpha = 0.05 / len(maps)
    facts: dict[str, float] = {"maps": len(maps)}
    parts = []
    for cls in ("number", "bracket", "separator"):
        per = [m[cls] for m in maps.values()]
        facts[f"{cls}_alike"] = sum(1 for c in per if c["p_above"] < alpha)
        facts[f"{cls}_below"] = sum(1 for c in per if c["hi"] < 0)
        c = chosen[cls]
        facts |= {cls: c["contrast"], f"{cls}_lo": c["lo"], f"{cls}_hi": c["hi"], f"{cls}_n": c["n"]}
        parts.append(
            f"{cls}s (n={c['n']}) {c['contrast']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}], alike in "
            f"{int(facts[f'{cls}_alike'])}/{len(maps)} maps"
        )
    text = (
        f"{d['model']}, the A.4 grading prompt, {len(d['tokens'])} tokens, {len(maps)} maps; within - between class "
        f"similarity at {select['map']}: " + "; ".join(parts) + f" (alike: permutation p < 0.05/{len(maps)})"
    )
    num = facts["number"]
    return Measured(str(d["model"]), len(d["tokens"]), num, facts["number_lo"], facts["number_hi"], text, facts)


def _self_bias_count(doc: Mapping[str, Any], k: str, where: str) -> dict[str, Any]:
    rows = sc.key(doc["self_bias"], k, where + " self_bias", "control")
    where += f" self_bias.{k} row 0"
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{where.rsplit(' row', 1)[0]}: must be a non-empty list of counts")
    c = sc.SELF_BIAS.check(rows[0], where)
    if max(c["negative"], c["significant"]) > c["heads"]:
        raise InputError(f"{where}: counts {c['negative']} and {c['significant']} of {c['heads']} heads")
    return c


def self_bias(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens kernels --sink-control --json``: heads with negative self-bias, flagged at the margin and
    below zero by a one-sided t-test (with the number chance gives), as measured and with position 0 removed."""
    doc = sc.SELF_BIAS_DOC.check(sc.load_json(path), str(path))
    a, b = (_self_bias_count(doc, k, str(path)) for k in ("as measured", "position 0 removed"))
    n = int(a["heads"])
    if b["heads"] != n:
        raise InputError(f"{path}: {b['heads']} heads with position 0 removed, {n} as measured")
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
    doc = sc.SELF_RANK_DOC.check(sc.load_json(path), str(path))
    stacks = sc.SELF_RANK.check_all(doc["stacks"], f"{path} stacks", 16)
    if not stacks:
        raise InputError(f"{path}: field 'stacks' holds no stack")
    for i, s in enumerate(stacks):
        sc.ordered(s, f"{path} stacks row {i}", "closer_lo", "closer", "closer_hi")
        s["summary"] = sc.RANK_SUMMARY.check(s["summary"], f"{path} stacks row {i} summary")
    st = {s["stack"] or "model": s for s in stacks}
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


#: the comparisons of a concept evaluation that its claim and verdict read
COMPARISONS = ("own_vs_offtopic", "own_vs_shuffled", "gold_vs_distractors", "chance_control")


def concept_eval(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens hellaswag concept-eval --json``: each comparison's share with its interval."""
    doc = sc.CONCEPT_DOC.check(sc.load_json(path), str(path))
    where = f"{path} comparisons"
    if len(doc["comparisons"]) > 64 or any(len(k) > 80 for k in doc["comparisons"]):
        raise InputError(f"{where}: over 64 comparisons, or a name over 80 characters")
    cs = {k: sc.COMPARISON.check(c, f"{where}.{k}") for k, c in doc["comparisons"].items()}
    for k, c in cs.items():
        sc.ordered(c, f"{where}.{k}", "lo", "share", "hi")
    for k in COMPARISONS:
        sc.key(cs, k, where, "comparison")
    parts = [f"{k} {c['share']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}] (chance {c['chance']:g})" for k, c in cs.items()]
    o = cs["own_vs_offtopic"]
    facts = {f"{k}_{x}": float(c[x]) for k, c in cs.items() for x in ("lo", "hi")}
    text = f"{doc['model']}, n={doc['n_items']} HellaSwag items: " + "; ".join(parts)
    return Measured(str(doc["model"]), int(doc["n_items"]), o["share"], o["lo"], o["hi"], text, facts)


MEASURES: dict[str, Callable[[Path, Mapping[str, Any]], Measured]] = {
    "scheme_picks": scheme_picks,
    "fold_picks": fold_picks,
    "selection_picks": selection_picks,
    "self_bias": self_bias,
    "self_rank": self_rank,
    "concept_eval": concept_eval,
    "cooccur": cooccur,
    "blocks": blocks,
    "steering_card": steering_card,
    "alignment": alignment,
    "heldout": heldout,
    "standard": standard,
    "unique": unique,
    "compaction": compaction,
    "self_mass": self_mass_share,
}
