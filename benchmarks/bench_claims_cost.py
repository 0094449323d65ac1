"""What the long runs behind docs/claims.md cost, measured on a few items and projected to the items they score.

Each probe runs the very commands ``scripts/claims_runs.sh`` still has to run (read from its dry run,
``WALKLENS=echo``: a step whose --json is committed is left out), with
``--limit N``, a temporary database and concept cache, and its ``--json`` in the temporary folder; it counts CPU
seconds (user + system of the child process, so another process on the machine does not inflate them) and takes
off the model's load, measured by a run that finds everything stored:

    per item = (CPU seconds of the run - CPU seconds of a run that computes nothing) / N

A full-set configuration's cost is the items it scores x (baseline + Test 1 + each control) per item; a selection
run's is the items after the 200 x its per item (its ten schemes and the baseline).  Printed and written to
--json; never asserted.  One thread, as the runs themselves:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_claims_cost.py [--items 30] [--selection-items 10] \
        [--only fullset|selection] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "claims_runs.sh"
WALKLENS = [sys.executable, "-m", "walklens"]
FULLSET = ("smollm2", "gemma3_0shot", "smollm2_5shot", "gemma3_5shot")
SELECTION = [(t, m, k) for t in ("1", "2") for m in ("smollm2-135m", "gemma3-270m") for k in ("0", "5")]


def planned(runs: Path, *step: str) -> list[list[str]]:
    """The walklens commands ``claims_runs.sh RUNS STEP`` would still run: a step whose --json is committed is left
    out, so the projection is the cost of what is left to do."""
    env = {**os.environ, "WALKLENS": "echo"}
    r = subprocess.run([str(SCRIPT), str(runs), *step], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return [line.split(" ") for line in r.stdout.splitlines() if line.startswith("hellaswag ")]


def _with(cmd: list[str], flags: dict[str, str]) -> list[str]:
    """``cmd`` with each flag of ``flags`` set to its value (replaced where ``cmd`` has it, else added)."""
    out = list(cmd)
    for flag, value in flags.items():
        if flag in out:
            i = out.index(flag)
            del out[i : i + 2]
        out += [flag, value]
    return out


def cpu_seconds(cmd: list[str], cwd: Path) -> float:
    """User + system CPU seconds of one walklens run (it must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([*WALKLENS, *cmd], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_claims_cost: {' '.join(cmd[:4])} failed: {r.stderr.strip()[-400:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def scored(shots: int) -> int:
    """Items 200-10,041 a run scores: all of them zero-shot, those outside the reserved pool with shots."""
    from walklens.lab.hellaswag.data import load_hellaswag, scored_items

    return len(scored_items(load_hellaswag()[200:], shots, "reserved"))


def _flag(cmd: list[str], flag: str, default: str | None = None) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else default


def baseline_of(cmd: list[str]) -> list[str]:
    """The baseline on the items ``cmd`` scores, in its database (the run then reads it back)."""
    out = ["hellaswag", "baseline"]
    for flag in ("--model", "--dtype", "--shots", "--pool", "--skip", "--limit", "--db"):
        value = _flag(cmd, flag, "200" if flag == "--skip" else None)
        out += [flag, value] if value is not None else []
    return out


def probe(cmds: list[list[str]], n: int, tmp: Path) -> dict[str, float]:
    """CPU seconds per item of each command (the first preceded by its baseline) on ``n`` items, load taken off."""
    db, cache = str(tmp / "probe.sqlite"), str(tmp / "cache")
    runs = [_with(c, {"--db": db, "--cache": cache, "--limit": str(n), "--json": str(tmp / "x.json")}) for c in cmds]
    base = baseline_of(runs[0])
    out = {"baseline": cpu_seconds(base, ROOT)}
    for c in runs:
        out[_name(c)] = cpu_seconds(c, ROOT)
    load = cpu_seconds(base, ROOT)  # every item stored: the load and the reading
    return {k: round((v - load) / n, 4) for k, v in out.items()} | {"load_s": round(load, 2)}


def _name(cmd: list[str]) -> str:
    return cmd[cmd.index("--control") + 1] if "--control" in cmd else cmd[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=30, help="items per full-set probe (default 30)")
    ap.add_argument("--selection-items", type=int, default=10, help="items per selection probe (default 10)")
    ap.add_argument("--only", choices=("fullset", "selection"), default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    doc: dict[str, Any] = {"cpu": platform.processor() or _cpu(), "threads": os.environ.get("OMP_NUM_THREADS"),
                           "command": " ".join(["python", *sys.argv]), "fullset": {}, "selection": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for name in FULLSET if args.only != "selection" else ():
            cmds = planned(tmp / "dry", "fullset", name)
            if not cmds:  # every step committed
                continue
            shots = int(_flag(cmds[0], "--shots") or 0)
            per = probe(cmds, args.items, tmp / name)
            items = scored(shots)
            total = items * sum(v for k, v in per.items() if k != "load_s")
            doc["fullset"][name] = {"per_item_cpu_s": per, "items": items, "hours": round(total / 3600, 2)}
            print(f"fullset {name}: {per} x {items} items = {total / 3600:.1f} h of one thread", flush=True)
        for t, m, k in SELECTION if args.only != "fullset" else ():
            cmds = planned(tmp / "dry", "selection", t, m, k)
            if not cmds:  # committed
                continue
            per = probe(cmds, args.selection_items, tmp / f"sel{t}{m}{k}")
            items = scored(int(k))
            total = items * (per["baseline"] + per["selection"])
            doc["selection"][f"T{t}_{m}_{k}shot"] = {"per_item_cpu_s": per, "items": items,
                                                     "hours": round(total / 3600, 2)}  # fmt: skip
            print(f"selection T{t} {m} {k}-shot: {per} x {items} items = {total / 3600:.1f} h", flush=True)
    doc["total_hours"] = round(sum(v["hours"] for s in ("fullset", "selection") for v in doc[s].values()), 1)
    print(f"total: {doc['total_hours']} h of one thread")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


if __name__ == "__main__":
    main()
