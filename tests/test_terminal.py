"""Terminal tables fit the terminal (walklens.cli.terminal): at 80 and 120 columns no line is wider than the
terminal, no column collapses into '…', and every header and token is visible on one line."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console

from _toy import write_items
from walklens.cli.terminal import Col, print_table, split_columns
from walklens.testing import tiny_model

HEADERS = {
    "walk": [
        "point",
        "t",
        "w_t",
        "w_t+1",
        "rank",
        "P",
        "ahead (raw)",
        "stays (raw)",
        "ahead (lens)",
        "stays (lens)",
        "0:the",
        "1: cat",
        "2: and",
        "3: the",
        "4: dog",
    ],
    "generate": ["step", "token", "P", "rank", "greedy", "|d_t|", "|Δd|", "angle°", "nearest tokens (P)"],
    "simmap": ["map", "min", "max", "mean off-diagonal", "V/dot", "final/cosine"],
    "heads": [
        "module",
        "max |error|",
        "max |output|",
        "head",
        "self mass",
        "foreign mass",
        "|centroid - x_t|",
        "cos(x_t, centroid)",
        "top members",
    ],
    "kernels": ["stack", "kernels", "negative_self", "far_amplifying", "local", "flat"],
    "power": ["layer", "|λ1|", "λ1", "gap |λ2/λ1|", "align out", "random (95%)", "other layers", "v1 ≈ tokens"],
    "steer": [
        "method",
        "layers",
        "alpha",
        "mean p(target)",
        "median rank (0 = top)",
        "mean KL neutral",
        "mean repeated 3-grams",
        "mean distinct-2",
        "mean push along u",
        "prompt",
        "continuation",
    ],
}
ARGS = {
    "walk": ("the cat and the dog",),
    "generate": ("the cat and the", "--max-new-tokens", "3"),
    "simmap": ("the cat and the dog",),
    "heads": ("the cat and the dog",),
    "kernels": ("--samples", "3", "--length", "20"),
    "power": ("the cat and the dog", "paris is the capital"),
    "steer": ("the cat and the", "--toward", " dog", "--layers", "0", "--alpha", "0,4", "--max-new-tokens", "2"),
}


def check_fits(out: str, width: int, headers: list[str]) -> None:
    """No line wider than ``width``, no collapsed cell, every header on one line."""
    lines = out.splitlines()
    assert lines, "nothing printed"
    wide = [l for l in lines if cell_len(l) > width]
    assert not wide, f"{len(wide)} line(s) wider than {width}:\n" + "\n".join(wide[:3])
    assert "…" not in out, out
    missing = [h for h in headers if not any(h in l for l in lines)]
    assert not missing, f"headers not visible: {missing}\n{out}"


@pytest.fixture(scope="module")
def tiny(saved_model):
    return str(saved_model(tiny_model("llama")))


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", list(ARGS))
def test_every_table_fits_the_terminal(tiny, capsys, monkeypatch, command, width):
    from walklens.cli import main

    monkeypatch.setenv("COLUMNS", str(width))
    assert main([command, *ARGS[command], "--model", tiny]) == 0
    check_fits(capsys.readouterr().out, width, HEADERS[command])


def test_wide_terminal_keeps_one_table(tiny, capsys, monkeypatch):
    """At 120 columns the walk's per-position table is one table; at 80 it is wrapped into two, each repeating
    the position and its token."""
    from walklens.cli import main

    monkeypatch.setenv("COLUMNS", "120")
    assert main(["walk", *ARGS["walk"], "--model", tiny]) == 0
    assert "(1/2)" not in capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["walk", *ARGS["walk"], "--model", tiny]) == 0
    out = capsys.readouterr().out
    assert "per position (2/2)" in out and out.count("┃ t ┃ w_t ") == 2


@pytest.fixture(scope="module")
def hellaswag_files(tmp_path_factory):
    """A four-item HellaSwag file and a results database holding a small Test 2 and a Test 1 sweep of the tiny
    model (the database ``walklens report`` reads)."""

    root = tmp_path_factory.mktemp("hs")
    data = write_items(
        root / "items.jsonl",
        [
            (f"the {w} ran to the", "", ["river.", "city.", "house.", "dog."], i % 4)
            for i, w in enumerate(("king", "dog", "man", "cat"))
        ],
    )
    return {"data": str(data), "db": str(root / "r.sqlite"), "root": root}


HELLASWAG = {  # command line (after --model) and what the output must show
    "baseline": (["hellaswag", "baseline"], ["score", "acc", "acc_norm", "baseline"]),
    "test1": (
        ["hellaswag", "test1", "--scheme", "enc=concat_each_example,layer=-1,word=w1mean,norm=None,seg=mean,ex=mean"],
        ["score", "acc_norm", "baseline", "normalised", "scheme:"],
    ),
    "test2": (["hellaswag", "test2"], ["score", "acc_norm", "baseline", "normalised", "scheme:"]),
    "sweep2": (
        ["hellaswag", "sweep", "--test", "2", "--grid", "standard", "--layers", "E,-1"],
        ["grid standard", "schemes to run", "groups computed now", "forward passes", "acc_norm", "report:"],
    ),
    "sweep1": (
        ["hellaswag", "sweep", "--test", "1", "--grid", "standard", "--layers", "E,-1"],
        ["grid standard", "schemes to run", "groups computed now", "forward passes", "acc_norm", "report:"],
    ),
}


@pytest.mark.parametrize("width", [80, 120])
def test_hellaswag_sweep_and_report_tables_fit_the_terminal(tiny, hellaswag_files, capsys, monkeypatch, width):
    """``walklens hellaswag baseline|test1|test2``, ``walklens hellaswag sweep`` and ``walklens report``: every
    line fits the terminal and every table stays whole (it used to be one line of about 200 characters, and the
    report printed only a path)."""
    from walklens.cli import main

    monkeypatch.setenv("COLUMNS", str(width))
    hs = hellaswag_files
    common = ["--model", tiny, "--data", hs["data"], "--db", hs["db"], "--no-progress"]
    for name, (argv, headers) in HELLASWAG.items():
        assert main([*argv, *common]) == 0, name
        check_fits(capsys.readouterr().out, width, headers)
    out_dir = hs["root"] / f"report{width}"
    assert main(["report", "--db", hs["db"], "--out", str(out_dir), "--folds", "3"]) == 0
    out = capsys.readouterr().out
    check_fits(
        out,
        width,
        [
            "model",
            "run",
            "items",
            "schemes",
            "baseline",
            "standard",
            "best in-sample",
            "3-fold held-out",
            "95% CI",
            "report:",
        ],
    )
    assert "5-fold" not in out
    tables = len(re.findall(r"\(\d+/\d+\)", out)) or 1  # "sweeps (2/3)": the table wrapped into several
    assert width == 120 or tables > 1
    for run in ("T2 0-shot acc", "T1 0-shot acc", "T1 0-shot acc_norm"):  # the key columns in every table
        assert sum(1 for l in out.splitlines() if f" {run} " in l) == tables, (run, out)


@pytest.mark.real
@pytest.mark.parametrize("width", [80, 120])
def test_demo_walk_fits_the_terminal(smollm2, width):
    """`make demo`: `walklens walk "The capital of France is"` on the real SmolLM2."""
    env = dict(os.environ, COLUMNS=str(width), OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "walklens", "walk", "The capital of France is"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    check_fits(r.stdout, width, HEADERS["walk"][:10] + ["0:The", "1: capital", "2: of", "3: France", "4: is", " Paris"])


# ---- the table wrapper itself ----------------------------------------------------------------------------------


def render(width: int, cols: list[Col], rows: list[list[str]], keys: int) -> tuple[str, int]:
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, legacy_windows=False)
    n = print_table(con, "a table", cols, rows, keys=keys)
    return buf.getvalue(), n


WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789|()-.", min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(width=st.integers(40, 160), keys=st.integers(1, 2), data=st.data())
def test_print_table_fits_any_width(width, keys, data):
    """Random headers and cells: every line fits, nothing collapses, every header and every cell of a
    fixed column stays whole on one line, and every column is printed (keys in every table)."""
    n_cols = data.draw(st.integers(keys + 1, 10))
    n_rows = data.draw(st.integers(1, 5))
    budget = (width - 1) // (keys + 1) - 3  # every fixed column fits beside the keys
    fixed = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789|()-.", min_size=1, max_size=min(budget, 20))
    wrap = [data.draw(st.booleans()) and i >= keys for i in range(n_cols)]
    cols = [Col(data.draw(fixed), wrap=w) for w in wrap]
    rows = [
        [" ".join(data.draw(st.lists(WORD, min_size=1, max_size=8))) if w else data.draw(fixed) for w in wrap]
        for _ in range(n_rows)
    ]
    out, n = render(width, cols, rows, keys)
    lines = out.splitlines()
    assert all(cell_len(l) <= width for l in lines) and "…" not in out
    for i, c in enumerate(cols):
        assert any(c.header in l for l in lines)
        if not c.wrap:
            assert all(any(r[i] in l for l in lines) for r in rows)
    natural = [max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(cols)]
    if 1 + sum(w + 3 for w in natural) <= width:
        assert n == 1  # never wrapped when it fits


@settings(max_examples=100, deadline=None, derandomize=True)
@given(widths=st.lists(st.integers(1, 60), min_size=2, max_size=12), keys=st.integers(1, 2), width=st.integers(60, 200))
def test_split_columns_partitions_in_order(widths, keys, width):
    keys = min(keys, len(widths) - 1)
    groups = split_columns(widths, keys, width)
    assert [i for g in groups for i in g] == list(range(keys, len(widths)))
    base = 1 + sum(w + 3 for w in widths[:keys])
    for g in groups:
        assert g and (base + sum(widths[i] + 3 for i in g) <= width or len(g) == 1)


def test_titles_are_text_and_cells_markup():
    """A title is printed as written (a model name like '[x]' is not markup); escaped cells stay literal."""
    from rich.markup import escape

    out, n = render(80, [Col("a"), Col("b")], [[escape("[bold]x[/bold]"), "y"]], keys=1)
    assert n == 1 and "[bold]x[/bold]" in out
    buf = io.StringIO()
    print_table(Console(file=buf, width=80, color_system=None), "[red]model[/red]: t", ["a"], [["1"]])
    assert "[red]model[/red]:t" in "".join(buf.getvalue().split())  # wrapped to the narrow table, but literal
