"""The tiled reading kernel (walklens.core.ranking) and what the explorer computes with it (issue 16's speed work):
ranks, top k and log-sum-exp by definition whatever the tiling; a target whose score a tile does not reproduce
bit for bit is read again (a token never outranks itself); ``encoding_walk(k=0, probs=False)`` gives the full
walk's ranks; on smollm2-135m the walk equals the whole-matrix float32 reading (the code path before tiling)
but for near-ties; the server computes the full reading of a point only when it is shown."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

import walklens
from _ties import assert_ranks_match, assert_topk_match
from walklens.analyses.walks import final_norm_fn
from walklens.core.ranking import TILE, Dense, Linear, read_rows, scratch
from walklens.server.app import create_app
from walklens.server.security import allowed_hosts
from walklens.server.state import Explorer
from walklens.testing import tiny_model


def ranks_by_definition(S: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Tokens scoring strictly above each target, counted on the whole score rows S [n, V]."""
    return (S[:, None, :] > S.gather(1, ids)[:, :, None]).sum(-1)


def problem(seed: int, n: int, V: int, D: int, bias: bool):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g) * 3
    M = torch.randn(V, D, generator=g)
    M[V // 3] = M[V // 2]  # two tokens with identical rows: exact ties
    b = torch.randn(V, generator=g) if bias else None
    ids = torch.randint(0, V, (n, 2), generator=g)
    return x, M, b, ids


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 40),
    V=st.integers(2, 700),
    tile=st.integers(1, 300),
    cosine=st.booleans(),
    bias=st.booleans(),
    k=st.integers(0, 12),
    lse=st.booleans(),
    reuse=st.booleans(),
)
def test_read_rows_by_definition(seed, n, V, tile, cosine, bias, k, lse, reuse):
    x, M, b, ids = problem(seed, n, V, 16, bias)
    inv_m = 1.0 / M.norm(dim=-1) if cosine else None
    buf = scratch(n, V, k).fill_(float("nan")) if reuse else None  # tiles written into one reused buffer
    got = read_rows(Linear(x, M, b, inv_m, buf), ids, k=k, lse=lse, tile=tile)
    whole = Linear(x, M, b, inv_m)
    dot, S = whole.tile(0, V)  # the same arithmetic, untiled
    assert_ranks_match(got.rank, S[:, None, :].expand(n, 2, V), ids, "ranks")
    assert got.rank.dtype == torch.long and got.top_i.shape == (n, min(k, V))
    torch.testing.assert_close(got.dot, dot.gather(1, ids), rtol=1e-5, atol=1e-5)
    if k:
        assert_topk_match(got.top_i, S, "top k")
        torch.testing.assert_close(got.top_v, S.topk(min(k, V), -1).values, rtol=1e-5, atol=1e-5)
    if lse:
        torch.testing.assert_close(got.lse, torch.logsumexp(dot, -1), rtol=1e-6, atol=1e-5)
    else:
        assert got.lse is None
    dense = read_rows(Dense(dot, S), ids, k=k, lse=lse, tile=tile)  # precomputed scores: gathered, exact
    assert torch.equal(dense.rank, ranks_by_definition(S, ids))


def test_identical_rows_are_ties_not_ranks():
    """A token never counts itself, nor an identical row (equal scores are not 'strictly above')."""
    x, M, _, _ = problem(0, 8, 300, 16, False)
    ids = torch.tensor([[100, 150]] * 8)  # V // 3 and V // 2: identical rows
    got = read_rows(Linear(x, M), ids, tile=7)
    assert torch.equal(got.rank[:, 0], got.rank[:, 1])
    assert torch.equal(got.rank, ranks_by_definition(x @ M.T, ids))


class OffByOneUlp(Linear):
    """A scorer whose target scores differ from its tiles' in the last bit for some rows (as a matrix kernel of
    another shape may sum them): the kernel must notice it and read those rows again."""

    def at(self, ids):
        dot, score = super().at(ids)
        down = torch.nextafter(score, torch.full_like(score, float("-inf")))
        score = score.clone()
        score[::2] = down[::2]  # one ulp low: the target itself would count as scoring above it
        return dot, score


def test_a_target_score_off_by_a_rounding_is_read_again():
    x, M, _, _ = problem(3, 24, 500, 16, False)
    S = x @ M.T
    ids = S.argsort(-1, descending=True)[:, [5, 40]]  # targets with known ranks 5 and 40 (no ties here)
    assert (S.gather(1, ids)[:, :, None] == S[:, None, :]).sum(-1).eq(1).all()
    scorer = OffByOneUlp(x, M)
    _, assumed = scorer.at(ids)
    naive = (S[:, None, :] > assumed[:, :, None]).sum(-1)  # counting against the off-by-one scores
    assert not torch.equal(naive, ranks_by_definition(S, ids))  # ... would be wrong: the check can fail
    got = read_rows(scorer, ids, k=3, lse=True, tile=64)
    assert torch.equal(got.rank, torch.tensor([[5, 40]] * 24))
    assert torch.equal(got.top_i, S.topk(3, -1).indices)


def test_default_tiles():
    """Ranks alone go tile by tile; a top k reads whole rows (one top k per row is far cheaper than merging)."""
    x, M, _, ids = problem(1, 4, TILE * 2 + 5, 8, False)
    a, b = read_rows(Linear(x, M), ids), read_rows(Linear(x, M), ids, k=2, lse=True)
    assert torch.equal(a.rank, b.rank) and torch.equal(a.rank, ranks_by_definition(x @ M.T, ids))


# ---- encoding_walk(k=0, probs=False): the rank maps of the explorer ---------------------------------------------


@pytest.mark.parametrize(
    "family,metric,norm",
    [("llama", "dot", "none"), ("gpt2", "cosine", "none"), ("gpt_neox", "cosine", "final"), ("t5", "dot", "final")],
)
def test_ranks_only_walk_is_the_full_walks_ranks(family, metric, norm):
    lm = tiny_model(family)
    tr = walklens.capture(lm, "the capital of france is paris and the city is big")
    full = walklens.encoding_walk(tr, k=4, metric=metric, norm=norm, progress=False)
    ranks = walklens.encoding_walk(tr, k=0, metric=metric, norm=norm, probs=False, progress=False)
    for w, r in ((full, ranks), (full.encoder, ranks.encoder)):
        if w is None:
            continue
        for name in ("rank_of_input", "rank_of_next", "escape_point", "escape_stable", "dot_input", "cos_next"):
            assert torch.equal(getattr(w, name).nan_to_num(), getattr(r, name).nan_to_num()), name
        assert r.top_ids.shape == (*r.rank_of_input.shape, 0) and torch.isnan(r.prob_of_next).all()


# ---- on smollm2-135m: the tiled walk against the whole-matrix float32 reading ----------------------------------


def whole_matrix_reading(lm, tr, metric: str, norm: str):
    """The walk as computed before tiling: every point's whole [T, |V|] float32 score matrix, ranks counted on it
    (tied model: the lens reads through W_U = V, with no bias)."""
    V = lm.embedding_matrix().detach().float()
    X = tr.hidden.float()
    if norm == "final":
        f = final_norm_fn(lm)
        with torch.no_grad():
            X = torch.stack([X[i] if p == "final" else f(X[i]) for i, p in enumerate(tr.points)])
    dot = X @ V.T
    S = dot / X.norm(dim=-1, keepdim=True) / V.norm(dim=-1) if metric == "cosine" else dot
    return dot, S


@pytest.mark.parametrize("metric,norm", [("dot", "none"), ("cosine", "none"), ("dot", "final"), ("cosine", "final")])
def test_smollm2_walk_equals_the_whole_matrix_reading(smollm2, metric, norm):
    tr = walklens.capture(smollm2, "The capital of France is Paris", points=["embed", "L*.resid_post", "final"])
    w = walklens.encoding_walk(tr, k=10, metric=metric, norm=norm, progress=False)
    r = walklens.encoding_walk(tr, k=0, metric=metric, norm=norm, probs=False, progress=False)
    assert torch.equal(w.rank_of_input, r.rank_of_input) and torch.equal(w.rank_of_next, r.rank_of_next)
    dot, S = whole_matrix_reading(smollm2, tr, metric, norm)
    P, T = w.rank_of_input.shape
    ids = tr.token_ids
    assert_ranks_match(w.rank_of_input, S, ids.expand(P, T), "rank of input")
    assert_ranks_match(w.rank_of_next[:, :-1], S[:, :-1], ids[1:].expand(P, T - 1), "rank of next")
    assert_topk_match(w.top_ids, S, "top ids")
    torch.testing.assert_close(w.top_scores, S.topk(10, -1).values, rtol=1e-5, atol=1e-5)
    p = dot.softmax(-1)  # probabilities: softmax of the inner products (eq. 12), whatever the metric
    torch.testing.assert_close(w.prob_of_next[:, :-1], p[:, torch.arange(T - 1), ids[1:]], rtol=1e-4, atol=1e-7)


# ---- the server reads a point in full only when it is shown -------------------------------------------------------


def test_server_reads_points_in_full_on_demand():
    ex = Explorer({"llama": tiny_model("llama")})
    token = "t" * 24
    with TestClient(create_app(ex, token, allowed_hosts("127.0.0.1", 8765)), base_url="http://127.0.0.1:8765") as c:
        text = "the capital of france is paris"
        r = c.post("/api/walk", json={"model": "llama", "text": text}, headers={"X-Walklens-Token": token})
        assert r.status_code == 200
        walks = {key[1:]: v for key, v in ex.results._d.items()}
        assert set(k[0] for k in walks) == {"walk", "walk point"}
        ranks = walks[("walk", text, "none", "dot")]
        assert ranks.k == 0 and torch.isnan(ranks.prob_of_next).all()  # no top k, no softmax for the map
        assert [k[-1] for k in walks if k[0] == "walk point"] == ["final"]
        fin = walks[("walk point", text, "none", "dot", "final")]
        sent = r.json()["final"]["prob_of_next"][:-1]  # the JSON rounds to 5 decimals
        assert sent == pytest.approx(fin.prob_of_next[0, :-1].tolist(), rel=1e-2)
        c.post(
            "/api/walk/cell",
            json={"model": "llama", "text": text, "point": 1, "position": 2, "k": 3},
            headers={"X-Walklens-Token": token},
        ).raise_for_status()
        assert ("llama", "walk point", text, "none", "dot", "L0.resid_post") in ex.results._d
