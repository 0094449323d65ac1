"""Path patching on circuits planted by hand (Wang et al. 2022, sec. 3.1's checks): in a two-layer attention-only
Llama whose weights are written, not trained, a *mover* head of layer 0 carries a token's identity from its position
to every later one, and a *copier* head of layer 1 reads what the mover wrote and writes it onto that token's
unembedding.  A *distractor* head of layer 1 reads the mover's subspace
with its query only.  Path patching from the mover finds exactly two paths, through the copier's value and the
distractor's query, and no other: not through the copier's query or key (they read the identities, which the mover
leaves alone), not through the distractor's key or value, not through the heads that never read the mover's
subspace, and nothing at a position the changed token cannot reach; the two carry the whole of the mover's effect on
the next layer.

The residual stream holds a constant direction a hundred times the others, so every RMSNorm divides by the same
scale on the clean and the corrupted run (to 1e-6): a head that does not read a subspace cannot see it change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from walklens.analyses.patching.paths import path_patch
from walklens.core.loading import wrap
from walklens.testing import tiny_tokenizer

D, H, DH = 64, 4, 16
BIG = 1000.0  # the constant direction (dim 0)
T_ID, M_ID, O_ID, J_ID = range(1, 17), range(17, 33), range(33, 49), range(49, 64)  # identity, moved, out, junk
MOVER, COPIER, DISTRACTOR = 0, 1, 2  # L0.H0 moves, L1.H1 copies, L1.H2's query reads what L0.H0 moved
X, Y = 40, 41  # the token that differs between the runs (clean X, corrupted Y)
CLEAN = [7, 12, X, 20, 25, 30, 9]
CORRUPT = [7, 12, Y, 20, 25, 30, 9]


def _planted() -> object:
    tok = tiny_tokenizer()
    V = len(tok)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=D, intermediate_size=8, num_hidden_layers=2, num_attention_heads=H,
        num_key_value_heads=H, head_dim=DH, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    u = torch.linalg.qr(torch.randn(16, 16, generator=g))[0]  # 16 orthonormal identities (tokens are mapped onto them)
    ident = torch.randn(V, 16, generator=g)
    ident[X], ident[Y] = u[0] * 4, u[1] * 4
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        m = model.model
        m.embed_tokens.weight[:, 0] = BIG
        m.embed_tokens.weight[:, list(T_ID)] = ident
        for layer in m.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)  # MLP weights zero: mlp_out = 0; q, k zero: uniform
        m.norm.weight.fill_(1.0)
        a0, a1 = m.layers[0].self_attn, m.layers[1].self_attn
        s = 25.0  # undoes the norm's 1/12.5 and then some
        # layer 0: the mover reads the identity, writes it into M; the other heads read it into the junk subspace
        for h in range(H):
            a0.v_proj.weight[h * DH : (h + 1) * DH, list(T_ID)] = torch.eye(16) * s
            target = M_ID if h == MOVER else J_ID
            cols = list(target)[: len(target)]
            a0.o_proj.weight[cols, h * DH : h * DH + len(cols)] = torch.eye(len(cols)) * (1.0 if h == MOVER else 0.3)
        # layer 1: the copier's value reads M, its query and key the identities; the distractor's query reads M, its
        # key and value the identities; H0 reads the identities, H3 the junk (query, key zero); all write into O
        for h in range(H):
            src = M_ID if h == COPIER else (T_ID if h % 2 == 0 else J_ID)
            n = len(src)
            a1.v_proj.weight[h * DH : h * DH + n, list(src)] = torch.eye(n) * s
            a1.o_proj.weight[list(O_ID)[:n], h * DH : h * DH + n] = torch.eye(n)
        rows = {h: slice(h * DH, (h + 1) * DH) for h in range(H)}
        a1.q_proj.weight[rows[COPIER], list(T_ID)] = torch.randn(DH, 16, generator=g) * 3
        a1.k_proj.weight[rows[COPIER], list(T_ID)] = torch.randn(DH, 16, generator=g) * 3
        a1.q_proj.weight[rows[DISTRACTOR], list(M_ID)] = torch.randn(DH, 16, generator=g) * 30
        a1.k_proj.weight[rows[DISTRACTOR], list(T_ID)] = torch.randn(DH, 16, generator=g) * 3
        model.lm_head.weight[:, list(O_ID)] = ident * 200  # the unembedding reads O: token t's logit ~ ident[t] . x_O
    return wrap(model, tok, name="planted-mover-copier")


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[X] - logits[Y]


@pytest.fixture(scope="module")
def lm():
    return _planted()


def test_the_planted_model_does_what_it_was_built_for(lm) -> None:
    """The clean run prefers X over Y at the last position by more than the corrupted run does, by a margin worth
    normalising."""
    from walklens.core.patching import run_logits

    with torch.no_grad():
        c = float(_metric(run_logits(lm, torch.tensor([CLEAN]), -1)[0]))
        x = float(_metric(run_logits(lm, torch.tensor([CORRUPT]), -1)[0]))
    assert c - x > 1.0


def test_the_mover_reaches_the_output_through_the_copiers_value_and_the_distractors_query_alone(lm) -> None:
    heads = [f"L1.H{h}.{w}" for h in range(H) for w in "qkv"]
    r = path_patch(lm, CLEAN, CORRUPT, sender=f"L0.H{MOVER}", receivers=["L1.resid_pre", *heads], metric=_metric)
    v = {name: r.values[i] for i, name in enumerate(r.points)}
    copied, steered = v[f"L1.H{COPIER}.v"], v[f"L1.H{DISTRACTOR}.q"]
    assert (np.abs(copied[2:]) > 1e-3).all()  # the value: a path at every position the change reaches
    np.testing.assert_allclose(copied[:2], 0.0, atol=1e-6)  # before the changed token: no change to move
    assert abs(steered[-1]) > 1e-3  # the query: a path at the position the metric reads, and only there
    np.testing.assert_allclose(steered[:-1], 0.0, atol=1e-6)
    np.testing.assert_allclose(copied + steered, v["L1.resid_pre"], rtol=1e-3, atol=1e-6)  # the two carry it all
    scale = float(np.abs(v["L1.resid_pre"]).max())
    for other in set(heads) - {f"L1.H{COPIER}.v", f"L1.H{DISTRACTOR}.q"}:  # and no other path
        np.testing.assert_allclose(v[other], 0.0, atol=1e-4 * scale, err_msg=other)


def test_a_head_that_moves_nothing_has_no_path(lm) -> None:
    """Layer 0's other heads write into the junk subspace, which layer 1's odd heads read: their path goes through
    those heads' values, never through the copier."""
    r = path_patch(lm, CLEAN, CORRUPT, sender="L0.H2", receivers=["L1.H1.v", "L1.H3.v"], metric=_metric)
    np.testing.assert_allclose(r.values[0], 0.0, atol=1e-4 * float(np.abs(r.values[1]).max()))
    assert np.abs(r.values[1]).max() > 1e-3
