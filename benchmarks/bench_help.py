"""How long ``walklens --help`` and ``import walklens.cli`` take, and which heavy packages they import (issue 56:
"``walklens --help`` in under 1 s"; ``build_parser()`` registers every command, so it imports them all, while
``walklens --help`` builds only the top level, ``build_parser(None)``).  Each is timed in a fresh interpreter,
best of ``--runs``; the load of the machine (``os.getloadavg``) is printed beside, since a busy machine stretches
every import.

    .venv/bin/python benchmarks/bench_help.py --runs 3 [--json docs/results/bench_help.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HEAVY = ("torch", "transformers", "numpy", "pandas", "matplotlib", "rich", "safetensors")


def _timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True)
    return time.perf_counter() - t0


def _imported(code: str) -> list[str]:
    probe = f"{code}\nimport sys, json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return list(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = {
        "load_average": os.getloadavg(),
        "cores": os.cpu_count(),
        "python -c 'import torch'": min(_timed(["-c", "import torch"]) for _ in range(a.runs)),
        "python -c 'import walklens.cli'": min(_timed(["-c", "import walklens.cli"]) for _ in range(a.runs)),
        "python -m walklens --help": min(_timed(["-m", "walklens", "--help"]) for _ in range(a.runs)),
        "imported by 'import walklens.cli'": _imported("import walklens.cli"),
        "imported by building the parser": _imported("import walklens.cli as c; c.build_parser()"),
        "imported by building the top-level parser": _imported("import walklens.cli as c; c.build_parser(None)"),
        "imported by 'walklens --help'": _imported(
            "import contextlib, io, walklens.cli as c\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    c.main(['--help'])"
        ),
    }
    for k, v in res.items():
        print(f"{k}: {v:.2f} s" if isinstance(v, float) else f"{k}: {v}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
