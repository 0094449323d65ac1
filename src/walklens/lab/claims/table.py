"""docs/claims.md: every claim's figure read from its result file, with its verdict."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Claim, Measured
from .readers import MEASURES
from .registry import CLAIMS
from .rules import ALPHA, RULES, VERDICT_RULES, VERDICTS
from .timings import why

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
    why = "not run by --quick: it runs only the zero-shot sweeps' held-out claims (the committed run: docs/claims.md)"
    return Source(None, {}, why if c.file else "")


def assess(claim: Claim, root: Path, src: Source | None = None) -> tuple[Measured | None, str]:
    """The claim's figure read from its result file (``src``: another source, for ``reproduce``) and its verdict."""
    src = src or committed(claim)
    if src.file is None:
        if src.skipped:
            return None, src.skipped
        reason = why(claim, root)  # a reason may start with its verdict word; else the claim is not measurable here
        return None, reason if reason.startswith(tuple(w + ":" for w in VERDICTS)) else f"not measurable here: {reason}"
    p = root / src.file
    if not os.path.lexists(p):  # anything there is read (a folder, a FIFO or a broken link: refused in one line)
        return None, f"not decided: {src.file} is missing" + (f" ({why(claim, root)})" if claim.why else "")
    m = MEASURES[claim.measure](p, src.select)
    verdict = RULES[claim.rule](m, claim.target)
    if not verdict.startswith(tuple(w + ":" for w in VERDICTS)):
        raise ValueError(f"claim {claim.id}: verdict {verdict[:60]!r} starts with no verdict word")
    return m, verdict


def _preamble() -> list[str]:
    """The verdict words with their rules, and what the Test 1/2 rows read (the definitions of the table)."""
    words = [f"- **{w}**: {VERDICT_RULES[w]}." for w in VERDICTS]
    return [
        "## Verdicts",
        "",
        "Every verdict starts with one of these words, applied by code from the row's file:",
        "",
        *words,
        "",
        "## What the Test 1 and Test 2 rows read",
        "",
        "- **Paired evidence only.** Each verdict comes from the picks of the same items: the held-out scheme's, the "
        "baseline's and the controls' (exact McNemar test, level "
        f"{ALPHA:g}; paired bootstrap intervals, items resampled in pairs). An interval set against a point "
        "baseline decides nothing. The 200-item rows read the k-fold held-out picks of the committed sweeps, "
        "re-scored item by item (`walklens hellaswag folds`, `docs/results/folds/`); a row whose sweep has no "
        "committed picks says so.",
        "- **Chance-corrected ratio** (acc - 0.25) / (baseline - 0.25) beside acc / baseline: 0 at chance, 1 at the "
        "baseline. The raw ratio has the floor 0.25 / baseline (0.76 at a baseline of 0.33). The seed's figures are "
        "raw ratios of gpt-neo-1.3B chosen and scored on the same items, its baseline and n not given: a row "
        "compares them by the baseline the seed's run would need for the two to agree.",
        "- **Controls**, the same scheme on the same items and endings (`walklens.lab.concepts.controls`): "
        '*ending* (the context and its examples replaced by the fixed text "Here is what happens next.", composed '
        "by the same scheme: only the endings differ between items), *shuffled* (another item's context: a fixed "
        "single-cycle permutation within each block of 200 consecutive items), *random* (each concept vector "
        'replaced by a seeded Gaussian direction of its norm). "The concept vectors carry the context" is read '
        "from the Test against *shuffled*.",
        "- **Few-shot pool.** Every few-shot row here drew its examples from the whole validation file but the query "
        "(pool *validation*: gold endings of scored items can appear in other items' prompts); runs with the "
        "reserved pool (`--pool reserved`, docs/hellaswag.md) are labelled `#pool=reserved` in their data key.",
        "",
        "## The claims",
        "",
    ]


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


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
        "`src/walklens/lab/claims/claims.toml`; the rules: `src/walklens/lab/claims/rules.py`).",
        "",
        *_preamble(),
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


def ratios_markdown(root: Path, claims: Sequence[Claim] = CLAIMS) -> str:
    """docs/sweep.md's table of the two ratios side by side: per Test 1/2 row compared with the seed's figure
    (rule ``seed_figure``) whose file is there, acc / baseline and the chance-corrected ratio with their
    intervals (paired bootstrap where the file has picks; the baseline as a point where it has none)."""
    lines = [
        "| claim | model, n | acc / baseline [95%] | chance-corrected [95%] | intervals | seed's figure (raw) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in claims:
        if c.rule != "seed_figure" or not c.file or not (root / c.file).exists():
            continue
        m, _ = assess(c, root)
        assert m is not None
        f = m.facts
        raw = f"{f['norm']:.2f} [{f['norm_lo']:.2f}, {f['norm_hi']:.2f}]"
        cc = f"{f['cc']:.2f} [{f['cc_lo']:.2f}, {f['cc_hi']:.2f}]"
        how = "paired bootstrap" if f.get("picks") else "Wilson, the baseline as a point (no picks committed)"
        lines.append(f"| {c.id} | {m.model}, {m.n:,} | {raw} | {cc} | {how} | {c.target:.3f} |")
    return "\n".join(lines) + "\n"
