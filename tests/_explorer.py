"""Shared by the explorer's tests (test_server.py, test_explorer_browser.py): a small sweep database and the
strings with markup that must reach the page as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: strings that would run a script or create an element if they reached markup
EVIL_TEXT = "</script><img src=x onerror=window.__pwned=1><script>window.__pwned=2</script>"
EVIL_MODEL = "<img src=x onerror=window.__pwned=3>model"

TEST_TEXT = "the capital of france is paris"  # every word is in the tiny models' vocabulary

LAYERS = ("-1", "0", "E")
NORMS = ("None", "L2")
OUTS = ["out_layer=-1,out_word=mean", "out_layer=E,out_word=mean", "out_layer=0,out_word=mean"]


def context(layer: str, norm: str) -> str:
    return f"enc=concat_each_example,layer={layer},word=mean,norm={norm},seg=mean,ex=mean,sim=dot"


def sweep_db(path: Path, model: str = EVIL_MODEL, n_items: int = 40, seed: int = 0) -> Path:
    """A results database with one Test 2 sweep run of 3 x 2 context groups x 3 outputs = 18 schemes over
    ``n_items`` items (random picks, seeded), and a baseline."""
    from walklens.lab.hellaswag.store import SweepRun, SweepStore

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=n_items).astype(np.uint8)
    with SweepStore(path) as st:
        run = SweepRun(
            model=model,
            data="toy",
            split="validation",
            shots=0,
            test=2,
            labels=labels,
            item_index=range(n_items),
            arch="decoder",
            n_layers=2,
        )
        rid = st.run_id(run)
        groups = []
        for layer in LAYERS:
            for norm in NORMS:
                preds = rng.integers(0, 4, size=(1, len(OUTS), n_items)).astype(np.uint8)
                preds[0, 0, : n_items // 2] = labels[: n_items // 2]  # some schemes clearly above chance
                groups.append((context(layer, norm), OUTS, preds))
        st.put_groups(rid, groups, ["acc"], labels, 0.0)
        st.set_baseline(rid, 0.4, 0.45, rng.integers(0, 4, size=(2, n_items)))
    return path


#: a generation that would run a script if it reached markup (the steering card's example continuations)
EVIL_GENERATION = "<img src=x onerror=alert(1)>"


def evil_card(tmp: Path) -> Any:
    """A small steering card of a tiny random Llama (one layer, one dose, activation addition), its first example
    continuation and prompt replaced by :data:`EVIL_GENERATION` and its model name by :data:`EVIL_MODEL`."""
    import dataclasses

    import torch

    from test_steering_card import write_set
    from walklens.lab.steeringcard import steering_card
    from walklens.testing import tiny_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        card = steering_card(
            tiny_model("llama"), write_set(tmp / "set.jsonl"), layers=[1], doses=[1.0], methods=["add"],
            max_new_tokens=2, n_boot=100,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    first = dataclasses.replace(card.examples[0], text=EVIL_GENERATION, prompt=EVIL_GENERATION)
    return dataclasses.replace(card, model_name=EVIL_MODEL, examples=[first, *card.examples[1:]])
