"""One cost model (walklens.costs) for the commands' limits and the explorer's bounds: the same oversized request
under the same limits is refused by ``walklens simmap`` (exit 2) and by the explorer's similarity map (413) with
the same estimate and the same number of tokens that fit; a text of that many tokens passes both.  Changing the
estimate in one place (here: one forward pass's memory) moves both refusals together.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import walklens.costs as C
from test_limits import long_llama, words
from walklens.costs.planning import model_memory
from walklens.server.app import create_app
from walklens.server.security import allowed_hosts
from walklens.server.state import Explorer

TOKEN = "test-token_0123456789"
HOST = "127.0.0.1:8765"
MEMORY_GB = 0.02  # a similarity map of ~1,000 tokens of the model below needs ~36 MB; about 745 tokens fit


@pytest.fixture(scope="module")
def long_lm():
    """A tiny random Llama (D=32, 2 layers, 4 heads) with a 4096-token context: the T x T terms dominate."""
    return long_llama()


@pytest.fixture(scope="module")
def model_dir(long_lm, saved_model):
    return str(saved_model(long_lm))


def cli_simmap(capsys, model_dir: str, n: int) -> tuple[int, str]:
    """``walklens simmap`` of an n-token text at ``final`` (cosine), one map, under --max-memory MEMORY_GB."""
    from walklens.cli import main

    code = main(
        [
            "simmap",
            words(n),
            "--model",
            model_dir,
            "--point",
            "final",
            "--metric",
            "cosine",
            "--max-memory",
            f"{MEMORY_GB}",
        ]
    )
    err = capsys.readouterr().err
    return code, err


def server_simmap(model_dir: str, n: int) -> tuple[int, str]:
    """The explorer's similarity map of the same text, started as ``walklens serve --model DIR --max-memory
    MEMORY_GB`` starts it: the models loaded within the budget, which they hold part of."""
    from walklens.cli import build_parser
    from walklens.cli.serve import _load

    args = build_parser().parse_args(["serve", "--model", model_dir, "--max-memory", f"{MEMORY_GB}"])
    models, held = _load(args)
    explorer = Explorer(models, limits=C.Limits(args.max_memory, args.max_work, model_bytes=held))
    with TestClient(create_app(explorer, TOKEN, allowed_hosts("127.0.0.1", 8765)), base_url=f"http://{HOST}") as c:
        r = c.post(
            "/api/simmap",
            json={"model": next(iter(models)), "text": words(n), "point": "final", "metric": "cosine"},
            headers={"X-Walklens-Token": TOKEN},
        )
    return r.status_code, r.json().get("error", "")


def need_and_fit(message: str) -> tuple[str, int]:
    """What a refusal says the request would need, and how many tokens it says fit."""
    m = re.search(r"would need (.*?); .*a text of at most (\d+) tokens fits", message)
    assert m, message
    return m.group(1), int(m.group(2))


def same_refusal(capsys, long_lm, model_dir: str, T: int) -> int:
    """Both refuse T tokens with the same estimate and the same fitting length N; both accept N tokens and
    refuse N + 1.  Returns N."""
    code, err = cli_simmap(capsys, model_dir, T)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("walklens: error: simmap over"), err
    status, error = server_simmap(model_dir, T)
    assert status == 413 and error.startswith(f"the similarity map view of {T:,} tokens would need"), error
    assert need_and_fit(err) == need_and_fit(error)
    held = C.fmt_bytes(model_memory(long_lm))  # the budget is the whole process: the map's need beside the weights
    assert f"of memory beside the model's {held} (--max-memory {MEMORY_GB:g})" in error
    n = need_and_fit(error)[1]
    assert 0 < n < T
    assert cli_simmap(capsys, model_dir, n)[0] == 0 and server_simmap(model_dir, n)[0] == 200
    assert cli_simmap(capsys, model_dir, n + 1)[0] == 2 and server_simmap(model_dir, n + 1)[0] == 413
    return n


def test_the_command_and_the_explorer_refuse_by_one_rule(capsys, long_lm, model_dir, monkeypatch):
    T = 1000
    n = same_refusal(capsys, long_lm, model_dir, T)
    forward = C.forward_memory
    monkeypatch.setattr(C, "forward_memory", lambda sh, t, batch=1: 2 * forward(sh, t, batch))
    assert same_refusal(capsys, long_lm, model_dir, T) < n  # one edit: both now let fewer tokens through


def test_every_view_that_runs_the_model_has_an_estimate(long_lm):
    """The views named in the explorer's token checks are the ones the cost model bounds, each growing with T."""
    from walklens import server
    from walklens.server.bounds import VIEW_COSTS, view_tokens

    folder = Path(server.__file__).parent
    named = {v for f in folder.glob("api_*.py") for v in re.findall(r'MAX_TOKENS, "([^"]+)"\)', f.read_text())}
    named |= set(re.findall(r'limit, "([^"]+)"\)', (folder / "traces.py").read_text()))  # the attention view
    assert (
        named - {"steering target"}
        == set(VIEW_COSTS)
        == {"walk", "similarity map", "attention", "decoding", "power", "steering"}
    ), named
    sh = C.model_shape(long_lm)
    for view, cost in VIEW_COSTS.items():
        assert cost(sh, 200).memory > cost(sh, 100).memory > 0 and cost(sh, 200).work > cost(sh, 100).work, view
    fit = view_tokens(sh, C.Limits(max_memory=MEMORY_GB))
    assert 0 < fit["attention"] < fit["walk"] <= 2048, fit


def test_the_attention_cache_drops_its_trace_before_the_next_is_made():
    """The attention view's trace may be as large as --max-memory allows: two never coexist."""
    from walklens.server.state import Cache

    cache = Explorer.__dataclass_fields__["attention"].default_factory()  # type: ignore[misc]
    sizes = []
    cache.get("a", lambda: "first")
    cache.get("b", lambda: sizes.append(len(cache)) or "second")
    assert sizes == [0] and len(cache) == 1 and cache.get("b", lambda: "again") == "second"
    plain = Cache(1)  # a plain cache keeps the old entry until the new one is made
    plain.get("a", lambda: "first")
    plain.get("b", lambda: sizes.append(len(plain)) or "second")
    assert sizes == [0, 1]
