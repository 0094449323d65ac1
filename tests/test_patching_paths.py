"""Path patching to the residual (issue 55): planted circuits on a tiny model show the path found and no other, and the
sender's change reaching the next layer's input equals patching the sender itself where nothing else reads it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from walklens.analyses.patching import patch
from walklens.analyses.patching.paths import path_patch
from walklens.base.errors import InputError
from walklens.core.patching import head_input, out_projection, projection_slice, record, run_logits
from walklens.testing import tiny_model

CLEAN = "the capital of france is paris"
CORRUPT = "the capital of england is paris"
METRIC = "logitdiff:paris,london"


def _silence_head(lm, layer: int, head: int) -> None:
    """Plant a circuit: head ``head`` of ``layer`` writes nothing (its W_o,h rows zeroed in the model's weight)."""
    attn = lm.model.model.layers[layer].self_attn
    d = lm.head_weights(layer).d_head
    with torch.no_grad():
        attn.o_proj.weight[:, head * d : (head + 1) * d] = 0


def test_planted_silent_head_has_no_path_and_a_live_one_does() -> None:
    lm = tiny_model("llama")
    _silence_head(lm, 0, 2)
    silent = path_patch(lm, CLEAN, CORRUPT, sender="L0.H2", receivers=["L1.resid_pre"], metric=METRIC)
    live = path_patch(lm, CLEAN, CORRUPT, sender="L0.H1", receivers=["L1.resid_pre"], metric=METRIC)
    # no path: the receiver sees the corrupted run (its cells run as one batch: equal within the batch's rounding)
    np.testing.assert_allclose(silent.values, 0.0, rtol=0, atol=1e-5)
    assert np.abs(live.values).max() > 1e-2
    np.testing.assert_allclose(live.values[0, :3], 0.0, rtol=0, atol=1e-5)  # before the differing token: no change


def test_the_last_sublayer_to_the_next_layer_is_the_sublayer_patch() -> None:
    """mlp_out of layer 0 reaches only the input of layer 1 (nothing else of layer 0 reads it): the path equals the
    activation patch of L0.mlp_out, up to the rounding of the residual's sum."""
    lm = tiny_model("llama")
    path = path_patch(lm, CLEAN, CORRUPT, sender="L0.mlp_out", receivers=["L1.resid_pre"], metric=METRIC)
    act = patch(lm, CLEAN, CORRUPT, points=["L0.mlp_out"], metric=METRIC, batch=1)
    np.testing.assert_allclose(path.values, act.values, rtol=0, atol=1e-5)
    assert path.method == "path" and path.points == ["L1.resid_pre"]


def test_bad_paths_refused_in_one_line() -> None:
    lm = tiny_model("llama")
    for kw, words in [
        (dict(sender="L1.H0", receivers=["L1.resid_pre"]), "after the sender"),
        (dict(sender="L0.H0", receivers=["L1.mlp_out"]), "resid_pre"),
        (dict(sender="L0.resid_pre", receivers=["L1.resid_pre"]), "give a head"),
    ]:
        with pytest.raises(InputError, match=words):
            path_patch(lm, CLEAN, CORRUPT, metric=METRIC, **kw)
    with pytest.raises(InputError, match="post-norm"):
        path_patch(tiny_model("opt_postnorm"), CLEAN, CORRUPT, sender="L0.H0", receivers=["L1.resid_pre"])


def _silence(lm, layer: int, head: int) -> None:
    """Plant a circuit in any family: head ``head`` of ``layer`` writes nothing (its rows of W_o zeroed, whichever way
    the output projection stores them)."""
    hw = lm.head_weights(layer)
    d, proj = hw.d_head, out_projection(lm, layer)
    with torch.no_grad():
        if proj.weight.shape[0] == hw.n_heads * d:  # Conv1D: [H d, D]
            proj.weight[head * d : (head + 1) * d] = 0
        else:
            proj.weight[:, head * d : (head + 1) * d] = 0


def test_head_receivers_find_the_path_and_no_other() -> None:
    """GPT-2 (one key/value per head): a silent receiver head (L1.H0) gets no path through its q, k or v; a live one
    (L1.H1) does through its value; a receiver fed no change is the plain pass bit for bit."""
    lm = tiny_model("gpt2")
    _silence(lm, 1, 0)
    recv = ["L1.H0.q", "L1.H0.k", "L1.H0.v", "L1.H1.v"]
    r = path_patch(lm, CLEAN, CORRUPT, sender="L0.H3", receivers=recv, metric=METRIC)
    np.testing.assert_allclose(r.values[:3], 0.0, rtol=0, atol=1e-5)
    assert np.abs(r.values[3]).max() > 1e-3 and r.points == recv  # 100x the silent rows' bound
    ids = lm.tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    plain = record(lm, ids, [], -1).logits
    with torch.no_grad(), head_input(lm, 1, "v", 1, torch.zeros(1, ids.shape[1], lm.d_model)):
        assert torch.equal(run_logits(lm, ids, -1)[0], plain)
    module, cols = projection_slice(lm, 1, "k", 2)
    assert module is lm.model.transformer.h[1].attn.c_attn and cols == slice(32 + 16, 32 + 24)
