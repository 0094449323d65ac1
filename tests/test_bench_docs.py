"""docs/power.md's generation and card benchmark figures are their committed result files (issue 53); an edited
number is caught."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POWER = (ROOT / "docs" / "power.md").read_text(encoding="utf-8")


def _rows() -> list[list[str]]:
    return [
        ln.strip("| ").split(" | ") for ln in POWER.splitlines() if ln.startswith("| ") and "bench_generation" in ln
    ]


def test_the_overhead_table_is_its_files() -> None:
    rows = _rows()
    assert len(rows) == 4
    for r in rows:
        d = json.loads((ROOT / "docs" / "results" / r[-1].strip("`")).read_text())
        cap, plain = d["capture_over_hf_generate"], d["batched_over_hf_generate"]
        want = [f"{cap['wall']:.2f}", f"{cap['cpu']:.2f}", f"{plain['wall']:.2f}", f"{plain['cpu']:.2f}"]
        assert r[2:6] == want and r[6] == ("yes" if d["same_tokens"] else "no")
        assert d.get("dtype", "float32") == r[1] and d["model"].startswith(r[0].split()[0].lower()[:6])


def test_the_card_speed_is_its_file() -> None:
    d = json.loads((ROOT / "docs" / "results" / "bench_card.json").read_text())
    ratio, wall, cpu = d["batched_over_one_at_a_time"], d["wall_seconds"], d["cpu_seconds"]
    text = " ".join(POWER.split())
    assert f"batched {wall['batched']:.1f} s wall and {cpu['batched']:.1f} s CPU" in text
    assert f"one at a time {wall['one_at_a_time']:,.1f} s wall and {cpu['one_at_a_time']:.1f} s CPU" in text
    assert f"**{ratio['wall']:.3f} of the time** (wall; CPU time {ratio['cpu']:.2f})" in text
    assert f"within {d['largest_difference']:.0e}".replace("e-0", "e-") in text and d["same_examples"]
