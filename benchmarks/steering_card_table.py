"""Markdown tables of steering-card JSON files (``walklens steer --card SET --json FILE``), as quoted in
docs/power.md, "The steering card": the choice made on ``choose`` with its ``heldout`` numbers, and every heldout
cell of one layer.  Run: ``python benchmarks/steering_card_table.py docs/results/steering/*.json``."""

from __future__ import annotations

import json
import sys
from typing import Any


def iv(x: dict[str, Any] | None, fmt: str = "{:.2f}") -> str:
    if x is None or x["value"] is None:
        return "-"
    lo, hi = ("?" if v is None else fmt.format(v) for v in (x["lo"], x["hi"]))
    return f"{fmt.format(x['value'])} [{lo}, {hi}]"


def cell_row(c: dict[str, Any]) -> str:
    dose = "-" if c["dose"] is None else f"{c['dose']:g}"
    where = "unsteered" if c["method"] == "none" else f"{c['method']} L{c['layer']} dose {dose}"
    return (
        f"| {c['kind']} | {where} | {c['realised_dose']:.2f} | {iv(c['effect'])} | {iv(c['wrong_way'])} | "
        f"{iv(c['log_ppl'])} | {iv(c['kl'])} | {iv(c['repetition'])} | {c['effect']['n']} |"
    )


HEAD = (
    "| kind | cell | realised dose | effect [95%] | wrong way [95%] | log ppl [95%] | KL neutral [95%] | "
    "repetition [95%] | n |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def main(paths: list[str]) -> None:
    docs = [json.load(open(p, encoding="utf-8")) for p in paths]
    print("Chosen on `choose` (largest mean effect within the perplexity budget), reported on `heldout`:\n")
    print(HEAD)
    for d in docs:
        for c in d["cells"]:
            if c["split"] == "heldout" and c["method"] == "none":
                print(cell_row(c))
        for ch in d["choices"]:
            if ch["heldout"] is None:
                print(f"| {ch['kind']} | {ch['method']}: no cell within the budget | | | | | | | |")
            else:
                print(cell_row(ch["heldout"]))
    print("\nThe Pareto front of effect against log perplexity on `heldout` (every cell on it, by log ppl):\n")
    print(HEAD)
    for d in docs:
        front = [c for c in d["cells"] if c["split"] == "heldout" and c["on_front"]]
        for c in sorted(front, key=lambda c: c["log_ppl"]["value"]):
            print(cell_row(c))


if __name__ == "__main__":
    main(sys.argv[1:])
