"""A target answer (issue 56): ``EncodingWalk.first_top(token)`` / ``rank_of(token)`` and ``walklens walk --target``
give the layer where a chosen token first becomes top-1 and stays, in both readings, with its rank at every point;
checked against an independent computation (dense products, the model's own logits) on a tiny model and on the
default model for the Eiffel Tower."""

from __future__ import annotations

import json

import pytest
import torch

import walklens
from walklens.base.errors import InputError
from walklens.testing import tiny_model

TEXT = "the cat and the dog walk to the house"


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _dense_ranks(x: torch.Tensor, M: torch.Tensor, tid: int) -> list[int]:
    """Ranks by the definition: the rows of ``x`` [P, D] scored against every row of M, scores strictly above the
    target's counted (no chunking, no tiles)."""
    s = x.double() @ M.double().T
    return [int(v) for v in (s > s[:, tid : tid + 1]).sum(1)]


def _first_top(ranks: list[int], residual: list[bool]) -> int:
    """The first residual point from which every later residual rank is 0, by brute force (-1: none)."""
    res = [i for i, r in enumerate(residual) if r]
    for i in res:
        if all(ranks[j] == 0 for j in res if j >= i):
            return i
    return -1


def test_raw_reading_ranks_are_the_dense_ranks(llama):
    tr = walklens.capture(llama, TEXT)
    tid = int(tr.token_ids.reshape(-1)[3])  # " the": a token of the text, read at the last position
    w = walklens.encoding_walk(tr, k=3, norm="none", target=tid)
    V = llama.model.get_input_embeddings().weight.detach().float()
    want = _dense_ranks(tr.hidden[:, -1].float(), V, tid)
    assert w.rank_of_target is not None and w.rank_of_target.tolist() == want
    ans = w.first_top(tid)
    assert ans.exact and ans.ranks == want and ans.position == len(tr.tokens) - 1
    i = _first_top(want, w.residual)
    assert ans.point == (w.points[i] if i >= 0 else None)
    assert w.rank_of(tid) == want


def test_lens_final_rank_is_the_models_own(llama):
    tr = walklens.capture(llama, TEXT)
    tid = 7
    w = walklens.encoding_walk(tr, k=2, norm="final", target=tid, target_position=4)
    with torch.no_grad():
        logits = llama.model(tr.token_ids.reshape(1, -1)).logits[0, 4].double()
    assert w.first_top(tid).ranks[-1] == int((logits > logits[tid]).sum())
    probs = torch.softmax(logits, -1)
    assert w.first_top(tid).probs[-1] == pytest.approx(float(probs[tid]), rel=1e-4)
    assert all(isinstance(p, float) for p in w.first_top(tid).probs)


def test_next_token_needs_no_target_and_agrees(llama):
    """w_t+1 was read by the walk itself: rank_of gives it exactly, and equals the target's reading."""
    tr = walklens.capture(llama, TEXT)
    nxt = int(tr.token_ids.reshape(-1)[5])
    plain = walklens.encoding_walk(tr, k=3, norm="final")
    read = walklens.encoding_walk(tr, k=3, norm="final", target=nxt, target_position=4)
    assert plain.first_top(nxt, position=4).exact
    assert plain.rank_of(nxt, position=4) == read.rank_of(nxt)


def test_first_top_means_top1_and_stays():
    from walklens.analyses.walks.target import first_top_index

    res = [True, True, False, True, True]
    assert first_top_index([0, 3, 9, 0, 0], res) == 3  # top-1 at the embedding, lost, then for good
    assert first_top_index([0, 0, 9, 0, 0], res) == 0  # a contribution point does not count
    assert first_top_index([0, 0, 0, 0, 1], res) == -1  # not top-1 at the top: never for good


def test_token_not_read_is_one_line(llama):
    w = walklens.encoding_walk(walklens.capture(llama, TEXT), k=2)
    with pytest.raises(InputError, match="target="):
        w.first_top("zzzz-not-a-token")
    with pytest.raises(InputError, match="not one"):
        walklens.encoding_walk(walklens.capture(llama, TEXT), k=1, target="the cat and")


def test_answer_frame_and_view(llama):
    pytest.importorskip("pandas")
    tr = walklens.capture(llama, TEXT)
    w = walklens.encoding_walk(tr, k=2, norm="final", target=9)
    a = w.first_top(9)
    df = a.to_pandas()
    assert list(df["rank"]) == a.ranks and df.attrs["token_id"] == 9
    html = a._repr_html_()
    assert "becomes top-1" in html
    page = w._repr_html_()  # the walk's own view opens with the target
    assert "becomes top-1" in page


def test_walk_frame_has_token_strings(llama):
    pytest.importorskip("pandas")
    w = walklens.encoding_walk(walklens.capture(llama, TEXT), k=3)
    df = w.to_pandas()
    for i in range(3):
        assert [w.labels[int(j)] for j in df[f"top_id_{i}"]] == list(df[f"top_token_{i}"])
    assert df["next_token"].iloc[0] == w.tokens[1]


def test_cli_target_first(tmp_path, saved_model, capfd, monkeypatch):
    from walklens.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    model = str(saved_model(tiny_model("llama")))
    out, js = tmp_path / "rep", tmp_path / "w.json"
    capfd.readouterr()
    argv = ["walk", TEXT, "--model", model, "--target", " house", "--out", str(out), "--json", str(js)]
    assert main([*argv, "--no-progress"]) == 0
    err = capfd.readouterr().out
    assert err.index("' house' after") < err.index("nearest token at each layer")
    assert "ahead: where w_t+1 first outranks w_t" in err and "first (lens)" not in err
    page = (out / "index.html").read_text()
    assert page.index("becomes top-1 and stays") < page.index("the logit lens") < page.index("norm=none")
    doc = json.loads(js.read_text())
    assert len(doc["walks"]["final"]["rank_of_target"]) == len(doc["walks"]["final"]["points"])


@pytest.mark.real
def test_eiffel_tower_paris_on_the_default_model(smollm2):
    """The issue's task: " Paris" for "The Eiffel Tower is located in the city of" on SmolLM2-135M.  The oracle is
    the user's workaround: the text with " Paris" appended, whose last-but-one position reads " Paris" as w_t+1."""
    text = "The Eiffel Tower is located in the city of"
    tr = walklens.capture(smollm2, text, points=["embed", "L*.resid_post", "final"])
    paris = smollm2.tokenizer.encode(" Paris", add_special_tokens=False)
    assert len(paris) == 1
    ids = torch.cat([tr.token_ids.reshape(-1), torch.tensor(paris)])
    longer = walklens.capture(smollm2, smollm2.tokenizer.decode(ids), points=["embed", "L*.resid_post", "final"])
    assert longer.token_ids.reshape(-1).tolist() == ids.tolist()
    for norm in ("final", "none"):
        w = walklens.encoding_walk(tr, k=5, norm=norm, target=" Paris")
        oracle = walklens.encoding_walk(longer, k=1, norm=norm)
        a = w.first_top(" Paris")
        assert a.exact and a.ranks == oracle.rank_of_next[:, -2].tolist()
        assert a.ranks[-1] == 0 and a.point is not None  # the model answers " Paris"
        assert a.point == oracle.points[_first_top(a.ranks, w.residual)]
    lens = walklens.encoding_walk(tr, k=5, norm="final", target=" Paris").first_top(" Paris")
    assert lens.layer is not None and 20 <= lens.layer < smollm2.n_layers  # measured: layer 27 of 30
