"""Shared by the explorer's tests (test_server.py, test_explorer_browser.py): a small sweep database and the
strings with markup that must reach the page as text."""

from __future__ import annotations

from pathlib import Path

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
    from walklens.hellaswag.store import SweepRun, SweepStore

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
