"""benchmarks/sweep_subset.py: which schemes a ``--where`` filter keeps (the subset compared across grids)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sweep_subset", ROOT / "benchmarks" / "sweep_subset.py")
sweep_subset = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep_subset)  # type: ignore[union-attr]


def test_where_keeps_only_matching_schemes() -> None:
    a = "enc=concat_all_examples,layer=middle,word=w1mean,norm=None,seg=None,ex=None"
    b = "enc=concat_all_examples,layer=middle,word=relu+|mean,norm=L2,seg=None,ex=None"
    c = "enc=sentence_level_segmentation,layer=-1,word=last"  # omitted norm/seg/ex take the defaults (None)
    assert sweep_subset.matches(a, {"norm": {"None"}})
    assert not sweep_subset.matches(b, {"norm": {"None"}})
    assert sweep_subset.matches(c, {"norm": {"None"}})
    assert sweep_subset.matches(b, {"norm": {"None", "L2"}, "layer": {"middle"}})
    assert not sweep_subset.matches(c, {"norm": {"None"}, "layer": {"middle", "-2"}})
    assert all(sweep_subset.matches(s, {}) for s in (a, b, c))
