"""Machine facts out of the library: the cost model's rates are measured by ``walklens calibrate`` and read back
from the walklens cache (checked; a bad file discarded with one warning line; shipped defaults when there is
none), its sizes derived from the writers' formats, one block size for the reports' and the explorer's heatmaps,
oneDNN prepacking in its own module, and no module reaching into another package's private names.
"""

from __future__ import annotations

import ast
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from walklens import costs as C
from walklens.base.errors import StaleCacheWarning
from walklens.cli import limits as L
from walklens.costs import calibration as M
from walklens.costs import sizes as S
from walklens.server import bounds

SRC = Path(__file__).resolve().parents[1] / "src" / "walklens"
SHAPE = C.Shape(
    layers=4,
    heads=8,
    kv_heads=8,
    d_model=256,
    d_ff=1024,
    vocab=4096,
    params=5_000_000,
    stacks=1,
    points=22,
    causal=True,
)
MEASURED = M.Rates(attn_element=321.0, write_work=1234.0, matmul_gflops=42.0)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty walklens cache of the test's own."""
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def matmuls(T: int) -> float:
    """The forward estimate's share that does not depend on the rates."""
    return C.forward_work(SHAPE, T) - M.rates().attn_element * C.attention_scores(SHAPE, T)


def quiet_rates() -> M.Rates:
    """The rates read with no warning at all."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return M.rates()


# ---- calibrated rates ------------------------------------------------------------------------------------------


def test_defaults_are_used_when_nothing_is_calibrated(cache):
    assert not cache.exists() and quiet_rates() is M.DEFAULTS
    T = 300
    assert C.forward_work(SHAPE, T) == matmuls(T) + M.DEFAULTS.attn_element * C.attention_scores(SHAPE, T)
    need = C.simmap_need(SHAPE, T, maps=1, captured=1, json=True)
    bare = C.simmap_need(SHAPE, T, maps=1, captured=1)
    assert need.work - bare.work == pytest.approx(M.DEFAULTS.write_work * need.files["--json"])


def test_calibrate_writes_the_rates_the_cost_model_reads(cache, capsys):
    """``walklens calibrate`` times a tiny random model, stores its rates in the cache, and every estimate then
    counts work with them."""
    from walklens.cli import main

    T = 300
    before = C.forward_work(SHAPE, T), C.walk_need(SHAPE, T, C.WalkPlan(4, 4, 4, 5), json=True).work
    assert main(["calibrate", "--tokens", "256"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    path = cache / M.FILE_NAME
    assert path.is_file() and "stored in" in out and "an attention score" in out
    stored = json.loads(path.read_text())
    got = quiet_rates()
    assert got == M.Rates(
        stored["attn_element"], stored["write_work"], stored["matmul_gflops"], bf16_gflops=stored["bf16_gflops"]
    )
    assert got != M.DEFAULTS
    assert stored["threads"] >= 1 and stored["model"]
    assert all(math.isfinite(v) and v > 0 for v in (got.attn_element, got.write_work, got.matmul_gflops))
    after = C.forward_work(SHAPE, T), C.walk_need(SHAPE, T, C.WalkPlan(4, 4, 4, 5), json=True).work
    assert after[0] == pytest.approx(matmuls(T) + got.attn_element * C.attention_scores(SHAPE, T))
    assert after[0] != before[0] and after[1] != before[1]


def test_saved_rates_change_every_estimate_of_work(cache):
    T = 500
    default = C.heads_need(SHAPE, T, json_layers=1, map_layers=1, block=1, json=True, out=False)
    M.save(MEASURED, model="a test", threads=1)
    assert quiet_rates() == MEASURED
    now = C.heads_need(SHAPE, T, json_layers=1, map_layers=1, block=1, json=True, out=False)
    assert now.memory == default.memory and now.files == default.files and now.work < default.work
    assert C.forward_work(SHAPE, T) == pytest.approx(matmuls(T) + 321.0 * C.attention_scores(SHAPE, T))


TAMPERED = {
    "negative": lambda r: {**r, "attn_element": -1.0},
    "zero": lambda r: {**r, "write_work": 0},
    "a string": lambda r: {**r, "matmul_gflops": "fast"},
    "missing": lambda r: {k: v for k, v in r.items() if k != "write_work"},
    "unknown field": lambda r: {**r, "speed_of_light": 1.0},
    "a list": lambda r: [r],
}


@pytest.mark.parametrize("how", [*TAMPERED, "NaN", "not JSON", "empty", "a folder"])
def test_a_tampered_calibration_file_is_discarded_with_one_warning(cache, how):
    M.save(MEASURED, model="a test", threads=1)
    path = cache / M.FILE_NAME
    assert quiet_rates() == MEASURED
    record = json.loads(path.read_text())
    path.unlink()
    if how in TAMPERED:
        path.write_text(json.dumps(TAMPERED[how](record)))
    elif how == "NaN":
        path.write_text(json.dumps(record).replace("321.0", "NaN"))
    elif how == "not JSON":
        path.write_text(json.dumps(record)[:-3])
    elif how == "empty":
        path.write_text("")
    else:
        path.mkdir()
    with pytest.warns(StaleCacheWarning) as seen:
        assert M.rates() is M.DEFAULTS
    (w,) = seen
    message = str(w.message)
    assert "\n" not in message and "the calibration file" in message and "defaults" in message, message
    assert C.forward_work(SHAPE, 100) == pytest.approx(
        matmuls(100) + M.DEFAULTS.attn_element * C.attention_scores(SHAPE, 100)
    )
    with warnings.catch_warnings():  # the same bad file is not read (nor warned about) again
        warnings.simplefilter("error")
        assert M.rates() is M.DEFAULTS
    if path.is_dir():
        path.rmdir()
    M.save(MEASURED, model="a test", threads=1)  # calibrating again replaces it
    assert quiet_rates() == MEASURED


def test_a_bad_measurement_is_never_written(cache):
    from walklens.base.errors import InputError

    with pytest.raises(InputError, match="attn_element"):
        M.save(M.Rates(attn_element=float("nan"), write_work=1.0, matmul_gflops=1.0), model="x", threads=1)
    assert not (cache / M.FILE_NAME).exists()


# ---- derived sizes ------------------------------------------------------------------------------------------------


def test_sizes_follow_the_writers():
    """The bytes per number are the writers' own: the ``--json`` writer on float32 scores, a report's heatmap
    on rounded cells, a token id of the vocabulary, and the page rendered empty."""
    from walklens.base.outputs import json_text
    from walklens.reports.html import Report

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    assert len(json_text(x.flatten())) / x.numel() == pytest.approx(S.JSON_FLOAT, rel=0.05)
    sims = torch.tensor([[float(f"{v:.3g}") for v in row] for row in (10 * x).tolist()])
    page = Report("").heatmap(sims).parts[-1]
    assert len(page) / x.numel() == pytest.approx(S.HTML_MAP_CELL, rel=0.1)
    assert S.json_int(49152) == len("49151,") and S.json_int(50) == len("49,")
    assert S.HTML_FIXED >= len(Report("").render()) > 1000
    assert S.per_number([1.5, 2.5], json.dumps) == len("1.5, ") and S.per_number([1.5], json_text) == len("1.5,")


# ---- one block size -----------------------------------------------------------------------------------------------


def fewest(rows: int, cols: int, cells: int, square: bool, per_col: int, gap: int) -> int:
    """The definition, by counting up: the smallest block that fits, or the one that leaves one group."""
    top = max(1, max(rows, cols) if square else cols)
    for b in range(1, top + 1):
        if (math.ceil(rows / b) if square else rows) * per_col * (math.ceil(cols / b) + gap) <= cells:
            return b
    return top


SIZES = [1, 2, 7, 64, 250, 499, 500, 1000, 1200, 2048]


def test_the_reports_and_the_explorer_reduce_maps_by_one_rule():
    for rows in SIZES:
        for cols in SIZES:
            for cells in (1, 9, 1000, 65_536, 250_000):
                for square in (True, False):
                    want = fewest(rows, cols, cells, square, 1, 0)
                    assert (
                        bounds.block_for(rows, cols, cells, square=square)
                        == want
                        == C.block_for(rows, cols, cells, square=square)
                    ), (rows, cols, cells, square)
                for per_col in (1, 4, 9):
                    want = fewest(rows, cols, cells, True, per_col, 1)
                    assert L.block_size(rows, cols, cells, per_col=per_col) == want, (rows, cols, cells, per_col)
    assert bounds.block_for(100_000, 3, 10) == 3  # more rows than cells: one group of columns, never a hang


def test_both_callers_use_the_cost_models_block_size(monkeypatch):
    monkeypatch.setattr(C, "block_for", lambda *args, **kwargs: 17)
    assert L.block_size(5000, 5000) == 17 and bounds.block_for(5000, 5000, square=True) == 17


# ---- modules ------------------------------------------------------------------------------------------------------


FLOORS = ("analyses", "base", "core", "lab")  #: packages made of packages (docs/architecture.md, "Rooms")


def room(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The top-level module or package a dotted name is in; inside a floor, the floor's module or package."""
    return parts[:3] if len(parts) > 2 and parts[1] in FLOORS else parts[:2]


def private_imports_across_packages(root: Path) -> list[str]:
    """``file:line name`` of every import of a private name (``_x``) of a walklens module from outside its own
    top-level module or package (``walklens.analyses.walks.reading._x`` is ``walks``' own: only ``walks/`` may import
    it)."""
    bad = []
    for f in sorted(root.rglob("*.py")):
        here = ("walklens", *f.relative_to(root).with_suffix("").parts)[:-1]  # the package relative imports start at
        own = room(("walklens", *f.relative_to(root).with_suffix("").parts))
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                target = (*here[: len(here) - node.level + 1], *(node.module.split(".") if node.module else ()))
            elif node.module and node.module.split(".")[0] == "walklens":
                target = tuple(node.module.split("."))
            else:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and room(target) != own:
                    bad.append(f"{f.relative_to(root)}:{node.lineno} {'.'.join(target)}.{alias.name}")
    return bad


def test_no_module_imports_a_private_name_of_another_package(tmp_path):
    assert private_imports_across_packages(SRC) == []
    (tmp_path / "costs.py").write_text("from .walks import _CHUNK_BYTES\n")  # the old cost model's import
    (tmp_path / "walks").mkdir()
    (tmp_path / "walks" / "__init__.py").write_text("from .reading import _CHUNK_BYTES\n")  # its own package: fine
    (tmp_path / "walks" / "cells.py").write_text("from ..capture import _point_names\n")
    assert private_imports_across_packages(tmp_path) == [
        "costs.py:1 walklens.walks._CHUNK_BYTES",
        "walks/cells.py:1 walklens.capture._point_names",
    ]


def test_prepacking_lives_in_its_own_module():
    """interventions switches layers to prepacked products; the oneDNN machinery is walklens.core.prepack."""
    import walklens.core.interventions as I
    import walklens.core.prepack as P

    text = (SRC / "core" / "interventions.py").read_text()
    assert "mkldnn" not in text and "packed_linear" in text
    lin = torch.nn.Linear(8, 4)
    assert P.packed_linear(lin) is None and not P.can_prepack(lin.weight)  # float32: MKL's products, never packed
    assert I.prepacked_linears.__module__ == "walklens.core.interventions"
