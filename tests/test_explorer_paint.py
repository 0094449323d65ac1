"""The explorer paints at once: the bfloat16 screen's provisional ranks (walklens.core.ranking.screen_ranks) first,
marked provisional, then the exact ranks in their place, piece by piece.  The screen counts by definition where
bfloat16 is exact (small integers) and never counts a target against itself; the exact kernel's row-blocked counting
equals the definition on more rows than a block, with ties; the server's provisional reply is the screen's, its exact
reply the walk's; the exact pass read in pieces (each kept, none read twice) joins to the walk read at once, bit for
bit; and a
click sent while the pieces are read is answered after the piece in progress, not after the pass."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

import walklens
from walklens.core.ranking import ROW_BLOCK, Linear, read_rows, screen_ranks
from walklens.server import api_walks
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


def test_lens_screen_screens_every_chunk_and_refuses_a_head_that_is_not_plain(monkeypatch):
    """norm="final": the screen decides on a few rows whether the head is x·W_U (+ bias) and then screens every
    chunk, the first too (not the model's head on the whole chunk and a float32 product to compare it with);
    a head that is not a plain linear map (Gemma 2's soft-capping) is read exactly instead."""
    from walklens.analyses.walks import reading

    calls: list[int] = []
    real = reading.screen_ranks
    monkeypatch.setattr(reading, "screen_ranks", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    lm = tiny_model("llama")
    tr = walklens.capture(lm, TEXT)
    rows = len(tr.points) * len(tr.tokens)
    for metric in ("dot", "cosine"):
        calls.clear()
        walklens.encoding_walk(tr, 0, metric, "final", probs=False, progress=False, screen=True, chunk_rows=rows)
        assert calls == [rows]  # one chunk, screened
    capped = tiny_model("gemma2")
    assert capped.model.config.final_logit_softcapping
    trc = walklens.capture(capped, TEXT)
    calls.clear()
    got = walklens.encoding_walk(trc, 0, "dot", "final", probs=False, progress=False, screen=True)
    want = walklens.encoding_walk(trc, 0, "dot", "final", probs=False, progress=False)
    assert calls == [] and torch.equal(got.rank_of_next, want.rank_of_next)


def test_screen_rows_are_kept_and_follow_an_edited_embedding():
    """The screen's bfloat16 token rows and the rows' norms are made once per model (walklens.core.kept) and made again
    when the weight is edited in place: the screen after an edit is the screen of a fresh model."""
    lm = tiny_model("llama")
    tr = walklens.capture(lm, TEXT)
    kw: dict[str, Any] = {"k": 0, "probs": False, "progress": False, "screen": True, "metric": "cosine"}
    first = walklens.encoding_walk(tr, **kw)
    assert torch.equal(walklens.encoding_walk(tr, **kw).rank_of_input, first.rank_of_input)
    with torch.no_grad():
        lm.model.get_input_embeddings().weight[:, 0] *= -3.0  # moves every row's norm and cosine
    edited = walklens.encoding_walk(tr, **kw)
    fresh = tiny_model("llama")
    trf = walklens.capture(fresh, TEXT)  # the same vectors, read against the edited rows
    with torch.no_grad():
        fresh.model.get_input_embeddings().weight[:, 0] *= -3.0
    want = walklens.encoding_walk(trf, **kw)
    assert torch.equal(edited.rank_of_input, want.rank_of_input)
    assert not torch.equal(edited.rank_of_input, first.rank_of_input)


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


# ---- the exact pass in pieces ----------------------------------------------------------------------------------------

TEXT = "the capital of france is paris and the city is big"
WALK_FIELDS = ["tokens", "points", "rank_of_input", "rank_of_next", "escape_point", "escape_stable"]
#: every field of a rank map's walk, compared bit for bit (NaN where it is undefined: equal as 0)
CELLS = ("rank_of_input", "rank_of_next", "dot_input", "dot_next", "cos_input", "cos_next", "vector_norm")
EXACT = (*CELLS, "prob_of_input", "top_ids", "step_length", "step_angle", "escape_point", "escape_stable", "token_ids")


def assert_same_walk(got: walklens.analyses.EncodingWalk, want: walklens.analyses.EncodingWalk) -> None:
    assert type(got) is type(want) and got.points == want.points and got.residual == want.residual
    for name in EXACT:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num()), name
        assert torch.equal(a.isnan(), b.isnan()) if a.is_floating_point() else True, name
    assert got.labels == want.labels and (got.tokens, got.matrix, got.model_dtype) == (
        want.tokens,
        want.matrix,
        want.model_dtype,
    )


@pytest.mark.parametrize(
    "family, metric, norm, groups",
    [
        ("llama", "dot", "none", [[0], [1], [2], [3]]),
        ("llama", "cosine", "final", [[0, 1], [2], [3]]),
        ("gpt2", "dot", "final", [[0], [1, 2, 3]]),
        ("gpt2", "cosine", "none", [[0, 1, 2], [3]]),
    ],
)
def test_pieces_join_to_the_walk_read_at_once(family, metric, norm, groups):
    lm = tiny_model(family)
    tr = walklens.capture(lm, TEXT, points=["embed", "L*.resid_post", "final"])
    assert [i for g in groups for i in g] == list(range(len(tr.points)))
    whole = walklens.encoding_walk(tr, 0, metric, norm, probs=False, progress=False)
    parts = [
        walklens.encoding_walk(tr, 0, metric, norm, points=[tr.points[i] for i in g], probs=False, progress=False)
        for g in groups
    ]
    joined = walklens.analyses.walks.join_walks(tr, parts)
    assert_same_walk(joined, whole)
    assert (joined.escape_point >= 0).any() and (joined.escape_stable >= 0).any()  # the escape points say something
    assert torch.isfinite(joined.step_length[1:]).all()  # each piece's first point measured from the point before
    a, b = groups[-1][0], groups[-1][-1] + 1
    rows = walklens.analyses.walks.walk_rows(joined, a, b)  # the inverse: the rows of one piece
    assert rows.points == parts[-1].points and rows.escape_point.max() < b - a
    for name in CELLS:
        assert torch.equal(getattr(rows, name).nan_to_num(), getattr(parts[-1], name).nan_to_num()), name
    esc = whole.escape_point
    assert torch.equal(rows.escape_point, torch.where((esc >= a) & (esc < b), esc - a, -1))


TOKEN = "t" * 24
H = {"X-Walklens-Token": TOKEN}


def client_of(ex: Explorer) -> TestClient:
    return TestClient(create_app(ex, TOKEN, allowed_hosts("127.0.0.1", 8765)), base_url="http://127.0.0.1:8765")


def counting(
    monkeypatch: pytest.MonkeyPatch,
    before: Callable[[list[str]], None] = lambda read: None,
    full: list[int] | None = None,
) -> list[str]:
    """Count the pieces of the exact pass the server reads (by their first point), calling ``before(read)`` first;
    ``full``: the number of pieces read when each point is read in full (a click's reading, under the lock)."""
    real, read = api_walks.encoding_walk, []

    def walk(tr: Any, *a: Any, **kw: Any) -> Any:
        piece = kw.get("k") == 0 and not kw.get("screen")
        if piece:
            before(read)
        elif full is not None and kw.get("k"):
            full.append(len(read))
        w = real(tr, *a, **kw)
        if piece:
            read.append(w.points[0])
        return w

    monkeypatch.setattr(api_walks, "encoding_walk", walk)
    return read


def test_the_server_reads_the_exact_pass_in_pieces_each_once(monkeypatch):
    lm = tiny_model("llama")
    ex = Explorer({"llama": lm})
    monkeypatch.setattr(api_walks, "PIECE_POINTS", 1)
    read = counting(monkeypatch)
    body = {"model": "llama", "text": TEXT, "fields": WALK_FIELDS, "norm": "final", "metric": "cosine"}
    tr = walklens.capture(lm, TEXT, points=["embed", "L*.resid_post", "final"])
    want = walklens.encoding_walk(tr, 0, "cosine", "final", probs=False, progress=False)
    with client_of(ex) as c:
        first = c.post("/api/walk", json={**body, "provisional": True}, headers=H).json()
        assert first["provisional"] and first["pieces"] == len(tr.points) == 4 and first["walk_points"] == tr.points
        for n in (2, 0, 3, 1, 2):  # in any order; asked twice, read once
            p = c.post("/api/walk", json={**body, "piece": n}, headers=H).json()
            assert p["piece"] == n and p["point_index"] == [n] and p["points"] == [tr.points[n]]
            assert p["rank_of_input"] == want.rank_of_input[n : n + 1].tolist()
            assert p["rank_of_next"] == want.rank_of_next[n : n + 1].tolist()
            assert p["escape_point"] is None and p["provisional"] is False  # needs every point: with the whole walk
        assert read == [tr.points[n] for n in (2, 0, 3, 1)]
        exact = c.post("/api/walk", json=body, headers=H).json()
        assert len(read) == 4  # joined from the pieces kept: none read again
        assert exact["rank_of_input"] == want.rank_of_input.tolist()
        assert exact["escape_point"] == want.escape_point.tolist()
        assert exact["escape_stable"] == want.escape_stable.tolist()
        assert_same_walk(ex.results.peek(("llama", "walk", TEXT, "final", "cosine")), want)
        assert not [k for k in ex.results._d if k[1] == "walk pieces"]  # the whole walk holds the pieces' rows
        again = c.post("/api/walk", json={**body, "piece": 1}, headers=H).json()  # from the whole walk now
        assert again["rank_of_next"] == want.rank_of_next[1:2].tolist() and len(read) == 4
        r = c.post("/api/walk", json={**body, "piece": 4}, headers=H)
        assert r.status_code == 400 and "has 4 pieces" in r.json()["error"]


def until(cond: Callable[[], bool], seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.002)


def test_a_click_during_the_exact_pass_is_answered_after_one_piece(monkeypatch):
    """The page asks for the pieces (here all at once, as a client that does not wait would); a click sent while
    the first piece is read is answered when that piece ends, before any other: it reads its own point only."""
    lm = tiny_model("llama")
    ex = Explorer({"llama": lm})
    monkeypatch.setattr(api_walks, "PIECE_POINTS", 1)
    started = threading.Event()

    def first_piece_waits_for_the_click(read: list[str]) -> None:
        if not started.is_set():
            started.set()
            until(lambda: ex.waiting["llama"] > 0)  # the click waits for the model

    at_click: list[int] = []  # the pieces read when the click reads its point
    read = counting(monkeypatch, first_piece_waits_for_the_click, at_click)
    body = {"model": "llama", "text": TEXT, "fields": WALK_FIELDS}
    tr = walklens.capture(lm, TEXT, points=["embed", "L*.resid_post", "final"])
    want = walklens.encoding_walk(tr, 0, probs=False, progress=False)
    P, last = len(tr.points), len(tr.points) - 1
    with client_of(ex) as c:
        pieces = [
            threading.Thread(target=lambda n=n: c.post("/api/walk", json={**body, "piece": n}, headers=H))
            for n in range(P)
        ]
        for t in pieces:
            t.start()
        started.wait(20)
        cell = c.post("/api/walk/cell", json={**body, "fields": None, "point": last, "position": 2}, headers=H)
        for t in pieces:
            t.join(20)
        assert cell.status_code == 200, cell.text
        assert at_click == [1] and P > 1  # the piece in progress, none after it; the click read its point once
        d = cell.json()
        assert d["point"] == tr.points[last] and d["rank_of_next"] == int(want.rank_of_next[last, 2])
        assert d["escape_point"] is None and d["escape_stable"] is None  # known with the whole walk only
        assert len(read) == P
        exact = c.post("/api/walk", json=body, headers=H).json()
        assert exact["rank_of_input"] == want.rank_of_input.tolist() and len(read) == P
        d = c.post("/api/walk/cell", json={**body, "fields": None, "point": last, "position": 2}, headers=H).json()
        assert d["escape_point"] == int(want.escape_point[2]) and d["escape_stable"] == int(want.escape_stable[2])


@pytest.mark.parametrize("T,P,chunk", [(30, 32, 512), (7, 5, 16), (5, 4, 5), (40, 3, 16), (1, 9, 4), (13, 6, 512)])
def test_a_piece_is_one_of_the_whole_walks_chunks(T: int, P: int, chunk: int) -> None:
    """The one-shot walk reads whole points per product (or a point's rows from its first row), so each explorer
    piece -- ``chunk // T`` consecutive points -- is read by exactly the product that reads it in the whole walk:
    the same rows, hence the same rounding at any row count (not only on tiny models)."""
    from walklens.analyses.walks import point_aligned_chunks

    spans = point_aligned_chunks(P * T, T, chunk)
    assert [r for a, b in spans for r in range(a, b)] == list(range(P * T))  # every row once, in order
    assert all(0 < b - a <= chunk for a, b in spans)
    g = max(1, chunk // T)
    for i in range(0, P, g):  # a piece of points [i, i + g): its own spans are the whole walk's, shifted
        n = min(g, P - i)
        own = [(a + i * T, b + i * T) for a, b in point_aligned_chunks(n * T, T, chunk)]
        assert set(own) <= set(spans)
