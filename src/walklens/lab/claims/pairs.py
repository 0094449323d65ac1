"""Paired evidence read from committed per-item picks (docs/claims.md, "Paired evidence"): every Test 1/2 row's
verdict is computed here from the picks of the same items, never from an interval set against a point baseline.

Two kinds of file hold picks: a ``walklens hellaswag folds --json`` file (the k-fold held-out best of a committed
200-item sweep, re-scored item by item, with its controls; one digit per item) and a ``walklens hellaswag
test1|test2 --skip N --json`` file (one scheme chosen on other items, with the baseline's picks), whose controls
are the files of the same command with ``--control C``.  From the picks: the accuracies (Wilson), acc / baseline and
the chance-corrected ratio (acc - 0.25) / (baseline - 0.25), each with a paired bootstrap interval (items resampled
in pairs), the exact McNemar test against the baseline and against each control on the same items.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import walklens.lab.claims.schemas as sc

from ...analyses.chance import wilson
from ...base.errors import InputError
from ..experiments.folds import FOLDS_FIELDS
from ..experiments.heldout import corrected, corrected_interval, paired_test, ratio_interval
from ..experiments.selection import SELECTION_FIELDS
from .base import Measured
from .rules import ALPHA

#: the controls a row may show, in their order (walklens.lab.concepts.controls.CONTROLS)
CONTROLS = ("ending", "shuffled", "random")


def _digits(value: Any, n: int, where: str) -> np.ndarray:
    """A row of picks written one digit (0-3) per item."""
    if not isinstance(value, str) or len(value) != n or not set(value) <= set("0123"):
        raise InputError(f"{where}: must be {n:,} digits 0-3 (one pick per item)")
    return np.frombuffer(value.encode("ascii"), np.uint8) - ord("0")


def _choice(v: Any, where: str) -> int:
    """One pick: an ending 0-3."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 3:
        raise InputError(f"{where}: a pick must be an ending 0-3, not {sc.name(v)}")
    return v


def _ci(x: float, lo: float, hi: float, sign: str = "") -> str:
    return f"{x:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def paired_facts(gold: np.ndarray, test: np.ndarray, base: np.ndarray, controls: Mapping[str, np.ndarray]) -> tuple[
    dict[str, float], str
]:  # fmt: skip
    """The facts a verdict reads and their text, from picks of the same items: the Test against the baseline
    (accuracies, both ratios with paired bootstrap intervals, McNemar) and against each control (McNemar)."""
    a, z = test == gold, base == gold
    n = int(a.size)
    acc, b = float(a.mean()), float(z.mean())
    lo, hi = wilson(int(a.sum()), n)
    blo, bhi = wilson(int(z.sum()), n)
    nlo, nhi = ratio_interval(a, z) if z.any() else (float("nan"), float("nan"))
    clo, chi = corrected_interval(a, z)
    pair = paired_test(a, z)
    f: dict[str, float] = {
        **{"acc": acc, "lo": lo, "hi": hi, "baseline": b, "norm": acc / b if b else float("nan")},
        **{"norm_lo": nlo, "norm_hi": nhi, "cc": corrected(acc, b), "cc_lo": clo, "cc_hi": chi},
        **{"paired_p": pair.p, "paired_lo": pair.lo, "paired_hi": pair.hi, "paired_diff": pair.diff},
        "picks": 1.0,  # the intervals are paired bootstraps of per-item picks
    }
    text = (
        f"n={n:,}: held out {_ci(acc, lo, hi)} vs baseline {_ci(b, blo, bhi)}; acc/baseline "
        f"{_ci(f['norm'], nlo, nhi)}, chance-corrected {_ci(f['cc'], clo, chi)} (paired bootstrap); paired vs "
        f"baseline {_ci(pair.diff, pair.lo, pair.hi, '+')}, McNemar p={pair.p:.2g}"
    )
    parts = []
    for c in CONTROLS:
        if c not in controls:
            continue
        k = controls[c] == gold
        t = paired_test(a, k)
        f |= {f"{c}_acc": float(k.mean()), f"{c}_p": t.p, f"{c}_lo": t.lo, f"{c}_hi": t.hi, f"{c}_diff": t.diff}
        parts.append(f"{c} {float(k.mean()):.3f} (Test - {c} {_ci(t.diff, t.lo, t.hi, '+')}, p={t.p:.2g})")
    f["controls"] = float(len(parts))
    text += "; controls on the same items: " + ("; ".join(parts) if parts else "none run")
    return f, text


def fold_picks(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens hellaswag folds --json``: the k-fold held-out best of a committed sweep item by item,
    refused when its re-scored k-fold accuracy is not the report's (the picks would not be the sweep's)."""
    doc = sc.FOLDS_DOC.check(sc.load_json(path), str(path))
    metric, n = select.get("metric", "acc"), int(doc["n"])
    where = f"{path} {metric}"
    gold = _digits(doc["gold"], n, f"{path} gold")
    test = _digits(sc.key(doc["heldout"], metric, f"{path} heldout", "metric"), n, f"{where} heldout")
    base = _digits(sc.key(doc["baseline"], metric, f"{path} baseline", "metric"), n, f"{where} baseline")
    ctl = {c: _digits(sc.key(v, metric, f"{path} controls.{c}", "metric"), n, f"{where} control {c}")
           for c, v in doc["controls"].items() if c in CONTROLS}  # fmt: skip
    report = sc.numbers([sc.key(doc["kfold_acc_report"], metric, str(path), "metric")], sc.ACC, where, "report")[0]
    again = float((test == gold).mean())
    if abs(again - report) > 1e-9:
        raise InputError(f"{where}: re-scored k-fold acc {again:.4f} is not the report's {report:.4f}")
    facts, text = paired_facts(gold, test, base, ctl)
    fold = sc.key(doc["fold_schemes"], metric, f"{path} fold_schemes", "metric")
    if not isinstance(fold, list) or not fold or not all(isinstance(x, str) for x in fold):
        raise InputError(f"{path} fold_schemes: field {metric!r} must be a list of schemes")
    schemes = len(set(fold))
    head = (
        f"{doc['model']}, Test {doc['test']}, {doc['shots']}-shot, {metric}, 5-fold held-out best of the committed "
        f"sweep ({schemes} distinct fold scheme{'s' * (schemes > 1)}, re-scored: acc {again:.3f} = the report's), "
    )
    return Measured(str(doc["model"]), n, facts["acc"], facts["lo"], facts["hi"], head + text, facts)


def _run_picks(path: Path, metric: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray | None]:
    """A ``walklens hellaswag ... --json`` file's document, gold, picks and the baseline's picks (None without)."""
    doc = sc.HELDOUT_PICKS.check(sc.load_json(path), str(path))
    gold = np.asarray([_choice(g, f"{path} gold[{i}]") for i, g in enumerate(doc["gold"])], dtype=np.int64)

    def picks(field: str) -> np.ndarray:
        got = doc[field]
        if not isinstance(got, list) or len(got) != len(gold) or not all(isinstance(p, dict) for p in got):
            raise InputError(f"{path}: field {field!r} must hold one {{acc, acc_norm}} pick per item")
        where = f"{path} {field}"
        return np.asarray([_choice(sc.key(p, metric, where, "metric"), where) for p in got], dtype=np.int64)

    base = picks("baseline_predictions") if doc.get("baseline_predictions") else None
    return doc, gold, picks("predictions"), base


def scheme_picks(path: Path, select: Mapping[str, Any]) -> Measured:
    """One scheme chosen on other items, scored on the items of a ``--skip N --json`` file, against the baseline
    and the controls on the same items (``select``: per control the file, beside this one, of the same command
    with ``--control C``; one not there yet is left out and the row says so)."""
    metric = select.get("metric", "acc")
    doc, gold, test, base = _run_picks(path, metric)
    if base is None:
        raise InputError(f"{path}: no baseline picks (a run of `walklens hellaswag ... --json`)")
    ctl: dict[str, np.ndarray] = {}
    unpaired: list[str] = []
    for c in CONTROLS:
        if c in select and ("/" in str(select[c]) or str(select[c]).startswith(".")):
            raise InputError(f"{path}: control file {str(select[c])[:80]!r} must be a file name beside it")
        if c in select and (path.parent / str(select[c])).exists():
            cdoc, cgold, cpicks, cbase = _run_picks(path.parent / str(select[c]), metric)
            same = cdoc["scheme"] == f"control={c};{doc['scheme']}"
            same = same and all(cdoc.get(k) == doc[k] for k in ("skip", "shots", "model"))
            if not same or not np.array_equal(cgold, gold):
                raise InputError(f"{select[c]}: not the items and scheme of {path}")
            differ = len(gold) if cbase is None else int((cbase != base).sum())
            if differ:  # other arithmetic (another CPU's bfloat16 kernels): its picks are not this run's to pair
                unpaired.append(f"{c} not paired: its baseline's picks differ from this file's on {differ:,} items")
                continue
            ctl[c] = cpicks
    facts, text = paired_facts(gold, test, base, ctl)
    if unpaired:
        text += " (" + "; ".join(unpaired) + ", computed with other arithmetic: rerun the Test and it together)"
    head = (
        f"{doc['model']}, Test {str(doc['test'])[-1]}, {doc['shots']}-shot, {metric}, scheme {doc['scheme']} chosen "
        f"on items 0-{doc['skip'] - 1}, scored on the next "
    )
    return Measured(str(doc["model"]), len(gold), facts["acc"], facts["lo"], facts["hi"], head + text, facts)


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values of ``ps`` (in their order): the ``i``-th smallest times ``m - i``, made
    non-decreasing, at most 1.  Four lines, so written here rather than taken from statsmodels (not a dependency)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - k) * ps[i]))
        out[i] = running
    return out


def selection_picks(path: Path, select: Mapping[str, Any]) -> Measured:
    """From ``walklens hellaswag selection --json``: the sweep's top schemes in sample, each scored on the held-out
    items beside the baseline; per scheme the exact McNemar test against it, Holm-adjusted over the schemes.  The
    facts: how many are below and above the baseline after the adjustment, the spread of their held-out accuracies
    and chance-corrected ratios, and where the in-sample best lands held out."""
    doc = sc.SELECTION_DOC.check(sc.load_json(path), str(path))
    metric, n = str(doc["metric"]), int(doc["n"])
    where = f"{path} {metric}"
    gold = _digits(doc["gold"], n, f"{path} gold")
    base = _digits(sc.key(doc["baseline"], metric, f"{path} baseline", "metric"), n, f"{where} baseline")
    z = base == gold
    rows = []
    for j, s in enumerate(doc["schemes"]):
        if not isinstance(s, dict) or not isinstance(s.get("picks"), dict) or not isinstance(s.get("rank"), int):
            raise InputError(f"{path} schemes[{j}]: must hold its rank and picks")
        a = _digits(sc.key(s["picks"], metric, f"{path} schemes[{j}].picks", "metric"), n, f"{where} schemes[{j}]")
        a = a == gold
        rows.append((int(s["rank"]), float(a.mean()), paired_test(a, z)))
    if not rows:
        raise InputError(f"{path}: no scheme")
    adjusted = holm([r[2].p for r in rows])
    below = sum(p < ALPHA and r[2].diff < 0 for r, p in zip(rows, adjusted))
    above = sum(p < ALPHA and r[2].diff > 0 for r, p in zip(rows, adjusted))
    accs = [r[1] for r in rows]
    b = float(z.mean())
    ccs = [corrected(x, b) for x in accs]
    first = min(rows, key=lambda r: r[0])  # the in-sample best
    rank_held = 1 + sum(x > first[1] for x in accs)
    facts = {"schemes": float(len(rows)), "below": float(below), "above": float(above), "baseline": b,
             "acc_min": min(accs), "acc_max": max(accs), "cc_min": min(ccs), "cc_max": max(ccs),
             "first_heldout_rank": float(rank_held), "holm_p_max": max(adjusted), "picks": 1.0}  # fmt: skip
    best = max(range(len(rows)), key=lambda i: accs[i])
    text = (
        f"{doc['model']}, Test {doc['test']}, {doc['shots']}-shot, {metric}, the {len(rows)} best schemes in sample "
        f"(items 0-{int(doc['chosen_on']) - 1}), each scored on n={n:,} held-out items: acc {min(accs):.3f} to "
        f"{max(accs):.3f} (chance-corrected {min(ccs):.2f} to {max(ccs):.2f}) vs baseline {b:.3f}; the in-sample "
        f"best ranks {rank_held} of {len(rows)} held out; the held-out best (in-sample rank {rows[best][0]}) "
        f"{rows[best][1]:.3f}, paired vs baseline {rows[best][2].diff:+.3f} [{rows[best][2].lo:+.3f}, "
        f"{rows[best][2].hi:+.3f}]; {below} below and {above} above the baseline (McNemar, Holm over the "
        f"{len(rows)}, level {ALPHA})"
    )
    return Measured(str(doc["model"]), n, max(accs), min(accs), max(accs), text, facts)


__all__ = [
    "CONTROLS",
    "FOLDS_FIELDS",
    "SELECTION_FIELDS",
    "fold_picks",
    "holm",
    "paired_facts",
    "scheme_picks",
    "selection_picks",
]
