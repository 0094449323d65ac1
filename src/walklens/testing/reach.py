"""Which causal-LM model types of the installed transformers walklens reads: every type built tiny and random
(:func:`walklens.testing.tiny_model`), loaded through its adapter file or a derived adapter, and its parity card
run in float32 and bfloat16 (docs/parity.md).

    python -m walklens.testing.reach --out docs/results/parity      # all types, two processes
    python -m walklens.testing.reach --types llama,qwen3 --out DIR   # some

Types run in child processes, a few per process (bounded memory and time: a default config can be huge; a type
that kills its process is run again alone), and each lands in one
group: ``adapter`` (an adapter file; the card passes), ``derived`` (a derived adapter; the card passes),
``refused`` (walklens refuses it in one line: the line is kept), ``card-fails`` (loaded but a check failed:
none should be here), or ``no-tiny-model`` (transformers itself cannot build a tiny random model of it here;
the reason is kept).  Writes ``reach.json`` and ``reach.md`` (the table docs/parity.md includes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MEMORY_LIMIT = 6 * 2**30
#: types per child process (one import of torch and transformers for all of them)
CHUNK = 8
CHECKS = (
    "logits",
    "hidden_states",
    "residual",
    "attention_identity",
    "attention_scores",
    "decoding_walk",
    "mlp_activation",
)
TIME_LIMIT = 240


def causal_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def one(model_type: str) -> dict[str, Any]:
    """The record of one model type (run in a child process)."""
    from transformers.utils import logging

    from ..analyses.parity import TEXTS, verify
    from ..base.errors import WalklensError
    from . import tiny_model

    logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    rec: dict[str, Any] = {"model_type": model_type}
    cards: dict[str, dict[str, Any]] = {}
    for dtype in ("float32", "bfloat16"):
        try:
            lm = tiny_model(model_type, dtype=dtype, as_model_type=True)
        except WalklensError as e:
            return {**rec, "group": "refused", "why": " ".join(str(e).split())}
        except Exception as e:  # transformers cannot build this config at tiny sizes
            return {**rec, "group": "no-tiny-model", "why": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
        try:
            card = verify(lm, texts=TEXTS[:1])
        except WalklensError as e:
            return {**rec, "group": "refused", "why": " ".join(str(e).split())}
        except Exception as e:
            return {**rec, "group": "card-fails", "why": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
        cards[dtype] = {
            "passed": card.passed,
            "failed": card.failed(),
            "family": card.family,
            "checks": {c.name: [c.error, c.passed] for c in card.checks},
            "limits": card.limits,
        }
    passed = all(c["passed"] for c in cards.values())
    derived = cards["float32"]["family"].startswith("derived:")
    group = ("derived" if derived else "adapter") if passed else "card-fails"
    return {
        **rec,
        "group": group,
        "cards": cards,
        "why": "" if passed else f"failed: {sorted({f for c in cards.values() for f in c['failed']})}",
    }


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _chunk(types: list[str]) -> list[dict[str, Any]]:
    """Records of some types from one child process (one import of torch for all); the types a dead or stuck
    child did not report are run again one per process, so one crash costs only its own type."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    rc: int | str  # the child's exit status, or "timeout"
    try:
        r = subprocess.run(
            [sys.executable, "-m", "walklens.testing.reach", "--one", ",".join(types)],
            capture_output=True,
            text=True,
            timeout=TIME_LIMIT * len(types),
            preexec_fn=_limit,
            env=env,
        )
        out, err, rc = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "", "timeout"
    got = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    done = {r["model_type"] for r in got}
    missing = [t for t in types if t not in done]
    if missing and len(types) == 1:
        why = (
            f"did not finish in {TIME_LIMIT} s"
            if rc == "timeout"
            else f"the process died (rc {rc}): {' '.join(str(err).split())[-200:]}"
        )
        return [{"model_type": types[0], "group": "no-tiny-model", "why": why}]
    return got + [rec for t in missing for rec in _chunk([t])]


def table(records: list[dict[str, Any]]) -> str:
    """The markdown table of docs/parity.md: one row per model type."""
    out = ["| model type | group | float32 | bfloat16 | limits declared / why |", "| --- | --- | --- | --- | --- |"]
    for r in sorted(records, key=lambda r: (r["group"], r["model_type"])):
        cards = r.get("cards", {})

        def mark(dt: str, cards: dict[str, Any] = cards) -> str:
            c = cards.get(dt)
            return "-" if c is None else "pass" if c["passed"] else "FAIL " + ",".join(c["failed"])

        limits = ", ".join(sorted(cards.get("float32", {}).get("limits", {}))) if cards else ""
        why = r.get("why", "").replace("|", "\\|")
        out.append(f"| {r['model_type']} | {r['group']} | {mark('float32')} | {mark('bfloat16')} | {limits or why} |")
    return "\n".join(out) + "\n"


def real_table(results: Path) -> str:
    """The table of the real models' cards (docs/parity.md) from their ``verify_*.json`` files."""
    rows = ["| model | dtype | " + " | ".join(CHECKS) + " | verdict |", "| --- | --- |" + " --- |" * (len(CHECKS) + 1)]
    for f in sorted(results.glob("verify_*.json")):
        doc = json.loads(f.read_text())
        got = {c["name"]: c for c in doc["checks"]}
        cells = [("n/a" if got[c]["error"] is None else f"{got[c]['error']:.2g}") if c in got else "-" for c in CHECKS]
        rows.append(
            f"| {doc['model']} | {doc['dtype']} | " + " | ".join(cells) + f" | {'pass' if doc['passed'] else 'FAIL'} |"
        )
    return "\n".join(rows) + "\n"


def reach_summary(results: Path) -> str:
    """The counts of reach.json, as a sentence for docs/parity.md."""
    path = results / "reach.json"
    if not path.is_file():
        return "The sweep has not been run yet.\n"
    doc = json.loads(path.read_text())
    counts = ", ".join(f"{g}: {n}" for g, n in sorted(doc["counts"].items()))
    return (
        f"{doc['types']} of {len(causal_types())} model types measured (transformers {doc['transformers']}): "
        f"{counts}.\n"
    )


def render_docs(docs: Path, results: Path) -> str:
    """docs/parity.md with its generated blocks filled from the result files."""
    text = docs.read_text()
    for name, block in (("parity-real", real_table(results)), ("reach", reach_summary(results))):
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        i, j = text.index(start) + len(start), text.index(end)
        text = text[:i] + "\n" + block + text[j:]
    return text


def _save(out: Path, records: list[dict[str, Any]]) -> None:
    """reach.json and reach.md, rewritten after every type (a killed sweep keeps what it measured)."""
    import transformers

    counts: dict[str, int] = {}
    for r in records:
        counts[r["group"]] = counts.get(r["group"], 0) + 1
    doc = {"transformers": transformers.__version__, "types": len(records), "counts": counts, "records": records}
    (out / "reach.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "reach.md").write_text(table(records))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m walklens.testing.reach", description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument(
        "--types",
        help="comma-separated model types, run again (default: every causal LM type not yet in --out's reach.json)",
    )
    ap.add_argument("--out", default="docs/results/parity", help="folder for reach.json and reach.md")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--docs", metavar="MD", help="only fill MD's generated blocks from --out's files (docs/parity.md)")
    args = ap.parse_args(argv)
    if args.docs:
        Path(args.docs).write_text(render_docs(Path(args.docs), Path(args.out)))
        return 0
    if args.one:
        for model_type in args.one.split(","):
            print(json.dumps(one(model_type)), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    old = json.loads((out / "reach.json").read_text())["records"] if (out / "reach.json").is_file() else []
    types = (
        args.types.split(",") if args.types else [t for t in causal_types() if t not in {r["model_type"] for r in old}]
    )
    records = [r for r in old if r["model_type"] not in set(types)]
    chunks = [types[i : i + CHUNK] for i in range(0, len(types), CHUNK)]
    with ThreadPoolExecutor(args.jobs) as pool:
        for recs in pool.map(_chunk, chunks):
            records += recs
            _save(out, records)
            for rec in recs:
                print(f"{rec['model_type']:32s} {rec['group']:14s} {rec.get('why', '')[:100]}", flush=True)
    print(json.dumps({g: sum(r["group"] == g for r in records) for g in sorted({r["group"] for r in records})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
