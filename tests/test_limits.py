"""Size limits of the commands (walklens.cli.limits over the cost model, walklens.costs): estimates before
computing, refusals in one line, the documented reductions, and estimates within a factor 2 of the measured memory
and file sizes.

Models: tiny random ones (walklens.testing); a tiny Llama with a 4096-token context makes the T x T terms
(attention, similarity maps) dominate, as they do for long texts on real models.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from walklens import costs as C
from walklens.cli import limits as L
from walklens.reports.html import block_labels, block_mean
from walklens.testing import WORDS, tiny_model, tiny_tokenizer

FACTOR = 2.0  # an estimate is within this factor of the measured size


def words(n: int) -> str:
    """A text of exactly n tokens for the tiny word-level tokenizer."""
    return " ".join(WORDS[(7 * i) % len(WORDS)] for i in range(n))


def long_llama():
    """A tiny random Llama (D=32, 2 layers, 4 heads) with a 4096-token context."""
    import transformers as T

    from walklens.core.loading import wrap

    tok = tiny_tokenizer()
    cfg = T.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    return wrap(model, tok, name="tiny-llama-long")


@pytest.fixture(scope="module")
def tiny(saved_model):
    return str(saved_model(tiny_model("llama")))


@pytest.fixture(scope="module")
def long(saved_model):
    return str(saved_model(long_llama()))


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from walklens.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse errors
        code = int(e.code)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(err: str) -> str:
    lines = [l for l in err.splitlines() if l.startswith("walklens:")]
    assert len(lines) == 1 and lines[0].startswith("walklens: error: "), err
    assert "Traceback" not in err
    return lines[0]


def notes(err: str) -> list[str]:
    return [l for l in err.splitlines() if l.startswith("walklens: note:")]


# ---- refusals: one line, exit 2, nothing written -------------------------------------------------------------

REFUSED = [
    (("walk", "the cat and the dog"), "--max-work", "walk over 5 tokens"),
    (("generate", "the cat and the dog"), "--max-work", "decoding walk"),
    (("simmap", "the cat and the dog"), "--max-work", "simmap over 5 tokens"),
    (("heads", "the cat and the dog"), "--max-memory", "heads over 5 tokens"),
    (("kernels", "--samples", "4", "--length", "32"), "--max-work", "kernels over 4 samples"),
    (("power", "the cat and the dog"), "--max-memory", "power over 1 text"),
    (("steer", "the cat and the", "--toward", " dog", "--layers", "0", "--alpha", "0,4"), "--max-work", "steering"),
]


def smallest_budget(model: str) -> str:
    """The smallest --max-memory that loads ``model`` and runs one token (the plan's), rounded up to a kB: what a
    command needs beyond it is over the budget."""
    from walklens.costs.planning import plan

    return f"{math.ceil(plan(model, tokens=1).smallest / 1e3) / 1e6:g}"


@pytest.mark.parametrize("args,option,what", REFUSED)
def test_over_a_limit_one_line_exit_2_nothing_written(tiny, tmp_path, capsys, args, option, what):
    js, out = tmp_path / "r.json", tmp_path / "report"
    value = smallest_budget(tiny) if option == "--max-memory" else "1e-12"
    code, stdout, err = cli(capsys, *args, "--model", tiny, option, value, "--json", str(js), "--out", str(out))
    assert code == 2
    line = one_error(err)
    assert what in line and "would need" in line and f"({option} {value})" in line, line
    if option == "--max-memory":  # the budget is the whole process: the command's need beside the model's weights
        assert "of memory beside the model's" in line, line
    assert not js.exists() and not (out / "index.html").exists() and stdout == ""


@pytest.mark.parametrize("value", ["0", "-1", "nan", "lots"])
def test_bad_limit_values(tiny, capsys, value):
    code, _, err = cli(capsys, "walk", "the cat", "--model", tiny, "--max-memory", value)
    assert code == 2 and "--max-memory" in one_error(err)


def test_json_over_max_output_is_refused_with_the_reducing_option(tiny, tmp_path, capsys):
    plan = C.WalkPlan(points=12, captured=12, shown=6, k=10, readings=2)
    need = C.walk_need(C.model_shape(tiny_model("llama")), 5, plan, json=True, out=False)
    mb = need.files["--json"] / 2 / C.MB  # half the estimated JSON
    code, _, err = cli(
        capsys,
        "walk",
        "the cat and the dog",
        "--model",
        tiny,
        "--points",
        "all",
        "--json",
        str(tmp_path / "w.json"),
        "--max-output",
        f"{mb}",
    )
    assert code == 2
    line = one_error(err)
    assert "--json file of" in line and "--max-output" in line and "--k" in line
    assert not (tmp_path / "w.json").exists()


# ---- reductions -------------------------------------------------------------------------------------------------


def test_walk_default_narrows_to_residual_points_with_a_note(tiny, tmp_path, capsys):
    """Between the work of all points and that of the residual points, the default reads the residual ones
    (one note); an explicit --points all is refused instead."""
    sh = C.model_shape(tiny_model("llama"))
    T = 5

    def work(points: int) -> float:
        plan = C.WalkPlan(points=points, captured=points, shown=6, k=10, readings=2)
        return C.walk_need(sh, T, plan, json=True, out=False).work

    residual = 2 + 3 * sh.layers  # embed, per layer resid_pre, resid_mid, resid_post, final
    assert sh.points == 2 + 5 * sh.layers
    limit = (work(residual) + work(sh.points)) / 2 / C.TFLOP
    js = tmp_path / "w.json"
    code, _, err = cli(capsys, "walk", words(T), "--model", tiny, "--json", str(js), "--max-work", f"{limit}")
    assert code == 0, err
    assert len(notes(err)) == 1 and "residual points" in notes(err)[0]
    points = json.loads(js.read_text())["walks"]["final"]["points"]
    assert len(points) == residual and all(p in ("embed", "final") or ".resid_" in p for p in points)

    js.unlink()
    code, _, err = cli(
        capsys, "walk", words(T), "--model", tiny, "--points", "all", "--json", str(js), "--max-work", f"{limit}"
    )
    assert code == 2 and "--max-work" in one_error(err) and not js.exists()


@pytest.mark.slow
def test_simmap_report_shows_block_means_json_every_value(long, tmp_path, capsys):
    T = 1200
    b = L.block_size(T, T)
    assert b == 3  # 400 x 401 cells fit 250,000; 600 x 601 do not
    js, out = tmp_path / "s.json", tmp_path / "sim"
    code, _, err = cli(
        capsys,
        "simmap",
        words(T),
        "--model",
        long,
        "--point",
        "final",
        "--metric",
        "dot",
        "--json",
        str(js),
        "--out",
        str(out),
    )
    assert code == 0, err
    assert len(notes(err)) == 1 and "blocks of 3 x 3" in notes(err)[0]
    full = torch.tensor(json.loads(js.read_text())["maps"]["final/dot"])
    assert full.shape == (T, T)
    page = (out / "index.html").read_text()
    # the map is drawn on the page from its document (results.js's simmap_view): the block means and their labels
    doc = json.loads(html.unescape(re.search(r"data-result='simmap_view' data-doc='([^']*)'", page).group(1)))
    z = torch.tensor(doc["maps"]["final/dot"], dtype=torch.float64)
    assert z.shape == (400, 400) and doc["labels"][1].startswith("3-5 ") and doc["block"] == 3
    want = full.double().reshape(400, 3, 400, 3).mean((1, 3))
    assert torch.allclose(z, want, rtol=5e-3, atol=1e-6)  # the report keeps 3 significant digits


def test_heads_report_keeps_the_layers_that_fit(long, tmp_path, capsys):
    """Without --maps the report draws as many evenly spaced layers as fit --max-output (a note says which);
    with --maps over the limit it refuses."""
    sh = C.model_shape(long_llama())
    T = 300
    b = L.block_size(T, T, per_col=sh.heads)

    def page(layers: int) -> float:
        return C.heads_need(sh, T, json_layers=2, map_layers=layers, block=b, json=False, out=True).files[
            "--out index.html"
        ]

    limit = (page(1) + page(2)) / 2 / C.MB  # one layer's maps fit, two do not
    out = tmp_path / "h"
    code, _, err = cli(capsys, "heads", words(T), "--model", long, "--out", str(out), "--max-output", f"{limit}")
    assert code == 0, err
    assert len(notes(err)) == 1 and "1 of 2 layers (1)" in notes(err)[0]
    page = (out / "index.html").read_text()
    assert "<h3>L1.attn</h3>" in page and "<h3>L0.attn</h3>" not in page
    assert (out / "index.html").stat().st_size <= limit * C.MB

    code, _, err = cli(
        capsys,
        "heads",
        words(T),
        "--model",
        long,
        "--out",
        str(tmp_path / "h2"),
        "--maps",
        "0,1",
        "--max-output",
        f"{limit}",
    )
    assert code == 2 and "--maps" in one_error(err)


def test_heads_refusal_names_the_text_that_fits(long, capsys):
    """--max-memory is the whole process: the text that fits is the one whose need fits beside the weights."""
    from walklens.core.loading import load_model
    from walklens.costs.planning import model_memory

    sh = C.model_shape(long_llama())
    weights = model_memory(load_model(long, progress=False))
    code, _, err = cli(capsys, "heads", words(2000), "--model", long, "--max-memory", "0.2")
    line = one_error(err)
    n = int(re.search(r"at most (\d+) tokens fits", line).group(1))
    need = lambda t: C.heads_need(sh, t, json_layers=2, map_layers=2, block=1, json=False, out=False)  # noqa: E731
    assert code == 2 and need(n).memory <= 0.2 * C.GB - weights < need(n + 1).memory
    assert f"beside the model's {C.fmt_bytes(weights)} (--max-memory 0.2)" in line, line


# ---- the estimates against measured sizes ---------------------------------------------------------------------

MEASURE = r"""
import ctypes, ctypes.util, gc, json, sys, torch, walklens
import walklens.cli.common as common
import walklens.cli.limits as limits
from walklens.cli import main

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

runs = json.loads(sys.argv[1])
lm = walklens.load_model(runs[0][runs[0].index("--model") + 1])
common.load_model = lambda spec, **kw: lm  # the weights are not the command's working memory
with torch.no_grad():
    lm.model(input_ids=torch.tensor([[7, 8, 9]]))
needs = []
check = limits.check
limits.check = lambda need, *a: (needs.append(need), check(need, *a))[1]
import matplotlib.pyplot, rich.table, tqdm.auto  # imports are not the command's working memory either
libc = ctypes.CDLL(ctypes.util.find_library("c"))
for argv in runs:
    gc.collect()
    libc.malloc_trim(0)  # hand the heap's free pages back, so they cannot hide this command's peak
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    base = status("VmRSS")
    rc = main(argv)
    print(json.dumps({"rc": rc, "peak": status("VmHWM") - base, "need": needs[-1].memory, "files": needs[-1].files}))
"""

MEASURED = {  # name: (tokens, arguments); every file is written under the test's folder
    "heads": (1500, ("heads", "--out", "h1")),  # the A.3 check's attention of every layer dominates
    "heads-json": (600, ("heads", "--json", "h2.json", "--out", "h2")),  # the JSON of every probability dominates
    "simmap": (1000, ("simmap", "--point", "final", "--metric", "dot", "--json", "s.json", "--out", "s")),
    "walk": (400, ("walk", "--json", "w.json", "--out", "w")),
}


@pytest.fixture(scope="module")
def measured(long, tmp_path_factory):
    """Every command of MEASURED run once in one fresh process (large blocks are mmap'ed and handed back on
    free, and the heap is trimmed before each command, so one command's freed memory does not hide the next
    one's peak): the estimate it checked, its peak resident memory above the loaded model (VmHWM) and the files
    it wrote."""
    tmp = tmp_path_factory.mktemp("measured")
    runs = [
        [
            cmd[0],
            words(T),
            "--model",
            long,
            *[str(tmp / a) if a.startswith(("h1", "h2", "s", "w")) else a for a in cmd[1:]],
        ]
        for T, cmd in MEASURED.values()
    ]
    env = dict(
        os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", COLUMNS="100", MALLOC_MMAP_THRESHOLD_="65536"
    )
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(runs)], capture_output=True, text=True, timeout=900, env=env
    )
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {name: (res, run) for name, res, run in zip(MEASURED, results, runs)}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory is read from /proc/self/status")
@pytest.mark.parametrize("name", list(MEASURED))
def test_estimates_within_factor_2_of_measured(measured, name):
    """Peak working memory and the size of every file written are within a factor 2 of the estimate the command
    checked before computing."""
    r, argv = measured[name]
    assert r["rc"] == 0
    assert r["need"] / FACTOR <= r["peak"] <= r["need"] * FACTOR, r
    paths = {
        "--json": Path(argv[argv.index("--json") + 1]) if "--json" in argv else None,
        "--out index.html": Path(argv[argv.index("--out") + 1]) / "index.html",
    }
    assert r["files"]
    for kind, size in r["files"].items():
        real = paths[kind].stat().st_size
        assert size / FACTOR <= real <= size * FACTOR, (kind, size, real)


# ---- helpers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,b", [((7, 5), 2), ((6, 6), 3), ((2, 9, 10), 4), ((5, 5), 1), ((3, 4), 9)])
def test_block_mean_is_the_mean_of_each_block(shape, b):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    m = block_mean(x, b)
    R, C = shape[-2:]
    assert m.shape == (*shape[:-2], -(-R // b), -(-C // b))
    for i in range(m.shape[-2]):
        for j in range(m.shape[-1]):
            want = x[..., i * b : (i + 1) * b, j * b : (j + 1) * b].mean((-2, -1))
            assert torch.allclose(m[..., i, j], want, atol=1e-6)


def test_block_size_and_labels():
    assert L.block_size(500, 500) == 2 and L.block_size(499, 499) == 1
    assert L.block_size(100, 100, cells=1000, per_col=4) == 7  # 15 x 4 x 16 = 960 <= 1000 < 17 x 4 x 18
    assert block_labels(["a", "b", "c", "d", "e"], 2) == ["0-1 a", "2-3 c", "4-4 e"]
    assert L.spread(30, 4) == [0, 10, 19, 29] and L.spread(3, 5) == [0, 1, 2] and L.spread(9, 1) == [8]


def test_help_says_what_is_computed_by_default(capsys):
    from walklens.cli import build_parser

    said = {
        "walk": "every captured point",
        "simmap": "three points",
        "heads": "every layer and every head",
        "generate": "20 tokens",
        "kernels": "16 shuffled samples",
        "power": "every layer",
        "steer": "each method, layer set",
    }
    for command, phrase in said.items():
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert phrase in text and "--max-memory" in text and "--max-output" in text and "--max-work" in text, command
