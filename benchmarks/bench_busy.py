"""Speed on a busy machine (issue 39): Test 1 and the baseline, quiet and beside one competing process at the same
priority: two threads (torch's default on two cores), two threads with GNU OpenMP's passive wait, and one thread
(``--threads 1``), as ratios measured side by side in one run.  Printed, never asserted.

    .venv/bin/python benchmarks/bench_busy.py [--limit-test1 60] [--limit-baseline 100] [--repeat 1] [--json FILE]

Each measurement is the wall time of a fresh ``walklens hellaswag ...`` process (load included, ``--no-db``).
The competitor is one pure-Python busy loop, started before the run and killed after it.  walklens runs the threads
it is given (``--threads``, else torch's own count: ``OMP_NUM_THREADS``, which the two-thread rows set), whatever
the load.  Target: busy / quiet with two threads <= 2.2 for both commands with the best configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WALKLENS = str(Path(sys.executable).with_name("walklens"))
#: configuration -> (environment, walklens options)
POLICIES: dict[str, tuple[dict[str, str], list[str]]] = {
    "2 threads (default)": ({"OMP_NUM_THREADS": "2"}, []),
    "2 threads, passive wait": ({"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}, []),
    "--threads 1": ({}, ["--threads", "1"]),
}


def timed(cmd: list[str], env: dict[str, str], busy: bool) -> float:
    """Wall seconds of ``cmd``; with ``busy``, beside one busy-looping process."""
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        if rival is not None:
            time.sleep(0.5)
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t0
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit-test1", type=int, default=60)
    ap.add_argument("--limit-baseline", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=1, help="measurements of each cell (the median is printed)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    commands = {
        f"test1 --limit {a.limit_test1}": ["hellaswag", "test1", "--limit", str(a.limit_test1)],
        f"baseline --limit {a.limit_baseline}": ["hellaswag", "baseline", "--limit", str(a.limit_baseline)],
    }
    rows = []
    for name, args in commands.items():
        for policy, (extra, options) in POLICIES.items():
            env = {**base, **extra}
            cmd = [WALKLENS, *args, "--no-db", "--no-progress", *options]
            cell = {}
            for busy in (False, True):
                runs = sorted(timed(cmd, env, busy) for _ in range(a.repeat))
                cell["busy" if busy else "quiet"] = runs[len(runs) // 2]
            rows.append({"command": name, "policy": policy, **cell, "ratio": cell["busy"] / cell["quiet"]})
            r = rows[-1]
            times = f"quiet {r['quiet']:6.1f} s  busy {r['busy']:6.1f} s"
            print(f"{name:24s} {policy:28s} {times}  busy/quiet {r['ratio']:.2f}")
    quiet_default = {r["command"]: r["quiet"] for r in rows if r["policy"].startswith("2 threads (")}
    for r in rows:
        if not r["policy"].startswith("2 threads ("):
            ratio = r["busy"] / quiet_default[r["command"]]
            print(f"{r['command']:24s} {r['policy']}: busy / quiet with 2 threads {ratio:.2f} (target <= 2.2)")
    if a.json:
        a.json.write_text(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
