"""The explorer paints twice: the bfloat16 screen's provisional ranks (walklens.ranking.screen_ranks) first, marked
provisional, then the exact ranks in their place.  The screen counts by definition where bfloat16 is exact (small
integers) and never counts a target against itself; the exact kernel's row-blocked counting equals the definition
on more rows than a block, with ties; the server's provisional reply is the screen's, its exact reply the walk's."""

from __future__ import annotations

import torch
from starlette.testclient import TestClient

import walklens
from walklens.ranking import ROW_BLOCK, Linear, read_rows, screen_ranks
from walklens.server.api_walks import screen_points
from walklens.server.app import create_app
from walklens.server.security import allowed_hosts
from walklens.server.state import Explorer
from walklens.testing import tiny_model


def ranks_by_definition(S: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return (S[:, None, :] > S.gather(1, ids)[:, :, None]).sum(-1)


def integer_problem(seed: int, n: int, V: int, D: int = 16):
    """Small integers: every bfloat16 rounding and product is exact, so the screen must count by definition;
    many exact ties (scores are integers in [-144, 144])."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (n, D), generator=g).float()
    M = torch.randint(-3, 4, (V, D), generator=g).float()
    return x, M, torch.randint(0, V, (n, 2), generator=g)


def test_screen_counts_by_definition_where_bfloat16_is_exact():
    for seed, V in ((0, 9000), (1, 4096), (2, 37)):  # more than one screen tile, exactly one, a small one
        x, M, ids = integer_problem(seed, 2 * ROW_BLOCK + 5, V)
        bias = torch.randint(-4, 5, (V,), generator=torch.Generator().manual_seed(seed)).float()
        want = ranks_by_definition(x @ M.T, ids)
        assert torch.equal(screen_ranks(x, M.bfloat16(), ids), want)
        assert torch.equal(screen_ranks(x, M.bfloat16(), ids, bias), ranks_by_definition(x @ M.T + bias, ids))


def test_row_blocked_exact_counts_equal_the_definition_with_near_ties():
    g = torch.Generator().manual_seed(3)
    n, V, D = 3 * ROW_BLOCK + 7, 5000, 24
    x, M = torch.randn(n, D, generator=g), torch.randn(V, D, generator=g)
    ids = torch.randint(0, V, (n, 2), generator=g)
    M[ids[:, 0][:50]] = M[ids[:, 1][:50]] * (1 + 2**-23)  # near-ties: the next token a rounding from the input
    M[V - 1] = M[ids[0, 0]]  # an exact tie
    got = read_rows(Linear(x, M), ids)
    S = Linear(x, M).tile(0, V)[1]
    assert torch.equal(got.rank, ranks_by_definition(S, ids))
    screened = screen_ranks(x, M.bfloat16(), ids)  # provisional: close, not exact
    assert (screened - got.rank).abs().float().mean() < 0.05 * V


def test_walk_screen_is_provisional_and_close():
    lm = tiny_model("llama")
    tr = walklens.capture(lm, "the capital of france is paris and the city is big")
    exact = walklens.encoding_walk(tr, k=0, probs=False, progress=False)
    screen = walklens.encoding_walk(tr, k=0, probs=False, progress=False, screen=True)
    assert screen.rank_of_input.shape == exact.rank_of_input.shape
    assert torch.equal(screen.rank_of_next[:, -1], exact.rank_of_next[:, -1])  # -1: no next token
    assert (screen.rank_of_input == exact.rank_of_input).float().mean() > 0.5
    try:
        walklens.encoding_walk(tr, k=3, progress=False, screen=True)
    except walklens.InputError:
        pass
    else:
        raise AssertionError("screen=True with a top k must be refused")


def test_server_sends_the_provisional_map_then_the_exact_one():
    lm = tiny_model("llama")
    ex = Explorer({"llama": lm})
    token, text = "t" * 24, "the capital of france is paris"
    fields = ["tokens", "points", "rank_of_input", "rank_of_next", "escape_point"]
    body = {"model": "llama", "text": text, "fields": fields, "norm": "final", "metric": "cosine"}
    H = {"X-Walklens-Token": token}
    tr = walklens.capture(lm, text, points=["embed", "L*.resid_post", "final"])
    rows = screen_points(list(tr.points))
    assert rows[0] == 0 and rows[-1] == len(tr.points) - 1 and len(rows) < len(tr.points)
    names = [tr.points[i] for i in rows]
    want_screen = walklens.encoding_walk(
        tr, 0, "cosine", "final", points=names, probs=False, progress=False, screen=True
    )
    want_exact = walklens.encoding_walk(tr, 0, "cosine", "final", probs=False, progress=False)
    with TestClient(create_app(ex, token, allowed_hosts("127.0.0.1", 8765)), base_url="http://127.0.0.1:8765") as c:
        first = c.post("/api/walk", json={**body, "provisional": True}, headers=H).json()
        assert first["provisional"] is True and first["final"] is None
        assert first["rank_of_input"] == want_screen.rank_of_input.tolist()
        assert first["points"] == names and first["point_index"] == rows
        assert ("llama", "walk", text, "final", "cosine") not in ex.results._d  # the exact pass is not run
        exact = c.post("/api/walk", json=body, headers=H).json()
        assert exact["provisional"] is False and exact["final"] is not None
        assert exact["rank_of_input"] == want_exact.rank_of_input.tolist()
        assert exact["rank_of_next"] == want_exact.rank_of_next.tolist()
        again = c.post("/api/walk", json={**body, "provisional": True}, headers=H).json()
        assert again["provisional"] is False and again["rank_of_next"] == exact["rank_of_next"]  # exact once kept
