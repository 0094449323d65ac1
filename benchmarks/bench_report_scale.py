"""A synthetic sweep database of the full Test 2 grid over the whole HellaSwag validation set, for measuring
``walklens report`` at scale (issue 12): 726,000 schemes (13,200 context groups x 55 choice encodings, the real
scheme names of ``GridSpec.full(2)``) x 10,042 items, random 2-bit predictions written straight into a
:class:`~walklens.lab.hellaswag.store.SweepStore` (about 1.8 GB).

    .venv/bin/python benchmarks/bench_report_scale.py --db /tmp/full.sqlite [--fraction 0.1]
    /usr/bin/time -v .venv/bin/walklens report --db /tmp/full.sqlite --out /tmp/full-report

``--fraction`` keeps that share of the groups (e.g. 0.1: 72,600 schemes).  The stored accuracies are the
predictions' own (computed per group as they are written).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, type=Path)
    ap.add_argument("--items", type=int, default=10_042)
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from walklens.lab.experiments.grid import GridSpec, group_by_context
    from walklens.lab.hellaswag.store import SweepRun, SweepStore, unpack_predictions

    if a.db.exists():
        raise SystemExit(f"{a.db} exists")
    t0 = time.perf_counter()
    schemes, _ = GridSpec.full(2).enumerate("decoder")
    groups = list(group_by_context(schemes).values())
    groups = groups[: max(1, round(len(groups) * a.fraction))]
    t1 = time.perf_counter()
    n = a.items
    rng = np.random.default_rng(a.seed)
    labels = rng.integers(0, 4, n).astype(np.uint8)
    with SweepStore(a.db) as st:
        run = SweepRun(
            model="synthetic",
            data="synthetic",
            split="validation",
            shots=0,
            test=2,
            labels=labels,
            item_index=range(n),
            arch="decoder",
            n_layers=30,
        )
        rid = st.run_id(run)
        st.set_baseline(rid, 0.3, 0.3, np.zeros((2, n), np.uint8))
        rows = []
        for g in groups:
            outs = [s.out_part() for s in g]
            count = len(outs) * n
            b = rng.integers(0, 256, size=(count + 3) // 4, dtype=np.uint8)
            if count % 4:
                b[-1] &= (1 << (2 * (count % 4))) - 1  # padding bits zero, as pack_predictions leaves them
            blob = b.tobytes()
            preds = unpack_predictions(blob, count).reshape(len(outs), n)
            acc = (preds == labels).mean(axis=1).astype(np.float32)
            rows.append((rid, g[0].context_part(), json.dumps(outs), json.dumps(["acc"]), acc.tobytes(), blob, 0.0))
            if len(rows) == 200:
                st.con.execute("BEGIN IMMEDIATE")
                st.con.executemany("INSERT INTO sweep_groups VALUES (?,?,?,?,?,?,?)", rows)
                st.con.execute("COMMIT")
                rows = []
        if rows:
            st.con.execute("BEGIN IMMEDIATE")
            st.con.executemany("INSERT INTO sweep_groups VALUES (?,?,?,?,?,?,?)", rows)
            st.con.execute("COMMIT")
    t2 = time.perf_counter()
    S = sum(len(g) for g in groups)
    print(
        f"{a.db}: {len(groups)} groups, {S} schemes x {n} items, {a.db.stat().st_size / 2**30:.2f} GiB; "
        f"grid {t1 - t0:.1f} s, writing {t2 - t1:.1f} s"
    )


if __name__ == "__main__":
    main()
