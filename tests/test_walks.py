"""Encoding walks, decoding walks and similarity maps (seed 000, sec. 2.1, 2.2.2, A.1, A.2, A.4)."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
import torch

import walklens
from _ties import assert_picks_match, assert_ranks_match, assert_topk_match, near
from walklens.analyses.walks import final_norm_fn
from walklens.base.errors import InputError
from walklens.core.capture import tokenize
from walklens.models import get_module
from walklens.testing import TINY_FAMILIES, tiny_model

TEXT = "the capital of france is paris and the city is big"

_cache: dict[str, tuple] = {}


def tiny(family: str):
    """A tiny random model whose norm weights are not 1 (so a norm applied twice would show), and a trace."""
    if family not in _cache:
        lm = tiny_model(family)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in lm.model.named_parameters():
                if p.dim() == 1 and name.endswith("weight"):
                    p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
        _cache[family] = (lm, walklens.capture(lm, TEXT))
    return _cache[family]


def model_logits(lm, trace) -> torch.Tensor:
    """The model's own logits for the trace's text, from a plain forward (no walklens code involved)."""
    ids = tokenize(lm, TEXT)
    with torch.no_grad():
        if lm.adapter.auto_class == "seq2seq":
            return lm.model(input_ids=ids, decoder_input_ids=trace.token_ids[None]).logits[0].float()
        return lm.model(input_ids=ids).logits[0].float()


def brute_scores(lm, trace, metric: str, norm: str) -> torch.Tensor:
    """[points, tokens, |V|] scores by the definition, for a tiny model (all at once: only small here)."""
    X = trace.hidden.float()
    if norm == "final":
        f = final_norm_fn(lm, trace.stack)
        with torch.no_grad():
            Xn = torch.stack([X[i] if p == "final" else f(X[i]) for i, p in enumerate(trace.points)])
        with torch.no_grad():
            out = torch.stack([lm.adapter.logits(lm.model, x).float() for x in Xn])
        assert metric == "dot"
        return out
    V = lm.embedding_matrix().detach().float()
    S = X @ V.T
    if metric == "cosine":
        S = S / X.norm(dim=-1, keepdim=True) / V.norm(dim=-1)
    return S


# ---- encoding walk -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", [f for f in TINY_FAMILIES])
def test_lens_top1_is_model_argmax(family):
    """norm='final', metric='dot': the last point's top-1 equals the model's argmax logits (every family)."""
    lm, tr = tiny(family)
    w = walklens.encoding_walk(tr, k=3, metric="dot", norm="final")
    lg = model_logits(lm, tr)
    fi = w.point_index("final")
    assert_picks_match(w.top_ids[fi, :, 0], lg, family)  # equal but for float near-ties (tests/_ties.py)
    # probabilities are the model's own (softmax of its logits)
    p = lg.softmax(-1)
    T = len(tr.tokens)
    nxt = tr.token_ids[1:]
    torch.testing.assert_close(w.prob_of_next[fi, :-1], p[torch.arange(T - 1), nxt], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.prob_of_input[fi], p[torch.arange(T), tr.token_ids], rtol=1e-4, atol=1e-6)
    if family == "t5":
        assert w.encoder is not None and w.encoder.stack == "enc"
        assert w.encoder.rank_of_input.shape == (len(tr.encoder.points), len(tr.encoder.tokens))
    else:
        assert w.encoder is None


@pytest.mark.parametrize(
    "family,metric,norm",
    [
        ("llama", "dot", "none"),
        ("llama", "cosine", "none"),
        ("gpt2", "dot", "none"),
        ("gpt_neox", "dot", "final"),
        ("gemma3", "dot", "final"),
        ("t5", "dot", "final"),
    ],
)
def test_ranks_match_brute_force_sort(family, metric, norm):
    lm, tr = tiny(family)
    k = 5
    w = walklens.encoding_walk(tr, k=k, metric=metric, norm=norm, chunk_rows=7)  # chunks cross point borders
    S = brute_scores(lm, tr, metric, norm)
    order = S.argsort(dim=-1, descending=True, stable=True)
    pos = order.argsort(dim=-1)  # pos[p, t, v]: place of token v in the sorted list
    ids = tr.token_ids
    T = len(ids)
    assert pos.shape == S.shape  # the sort by definition; ranks and top-k equal it but for float near-ties
    P = S.shape[0]
    assert_ranks_match(w.rank_of_input, S, ids.expand(P, T), "rank of input")
    assert_ranks_match(w.rank_of_next[:, :-1], S[:, :-1], ids[1:].expand(P, T - 1), "rank of next")
    assert (w.rank_of_next[:, -1] == -1).all()
    assert_topk_match(w.top_ids, S, "top ids")
    torch.testing.assert_close(w.top_scores, S.gather(-1, order[..., :k]), rtol=1e-4, atol=1e-4)
    assert w.rank_of_input.dtype == torch.long and w.top_ids.shape == (len(tr.points), T, k)


def test_chunking_does_not_change_results():
    lm, tr = tiny("llama")
    a = walklens.encoding_walk(tr, k=4, metric="cosine", chunk_rows=1)
    b = walklens.encoding_walk(tr, k=4, metric="cosine", chunk_rows=10_000)
    # matrix products of other shapes round differently: both equal the definition but for near-ties
    S = brute_scores(lm, tr, "cosine", "none")
    ids = tr.token_ids.expand(S.shape[0], -1)
    for x in (a, b):
        assert_topk_match(x.top_ids, S, "top ids")
        assert_ranks_match(x.rank_of_input, S, ids, "rank of input")
        assert_ranks_match(x.rank_of_next[:, :-1], S[:, :-1], ids[:, 1:], "rank of next")
    if torch.equal(a.rank_of_input, b.rank_of_input) and torch.equal(a.rank_of_next, b.rank_of_next):
        assert torch.equal(a.escape_point, b.escape_point)  # a function of the ranks
    torch.testing.assert_close(a.prob_of_next, b.prob_of_next, equal_nan=True)


def test_dot_cos_probs_steps_by_definition():
    lm, tr = tiny("llama")
    w = walklens.encoding_walk(tr, k=3, metric="dot", norm="none")
    V = lm.embedding_matrix().detach().float()
    X = tr.hidden.float()
    ids = tr.token_ids
    T = len(ids)
    Wt = V[ids]  # [T, D]
    torch.testing.assert_close(w.dot_input, (X * Wt).sum(-1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        w.cos_input, torch.nn.functional.cosine_similarity(X, Wt[None], dim=-1), rtol=1e-4, atol=1e-5
    )
    P = (X @ V.T).softmax(-1)
    torch.testing.assert_close(w.prob_of_next[:, :-1], P[:, torch.arange(T - 1), ids[1:]], rtol=1e-4, atol=1e-7)
    assert torch.isnan(w.prob_of_next[:, -1]).all() and torch.isnan(w.cos_next[:, -1]).all()
    torch.testing.assert_close(w.vector_norm, X.norm(dim=-1))
    # steps: between consecutive residual points only
    res = [i for i, p in enumerate(tr.points) if w.residual[i]]
    assert tr.points[res[0]] == "embed" and tr.points[res[-1]] == "final"
    for a, b in zip(res, res[1:]):
        torch.testing.assert_close(w.step_length[b], (X[b] - X[a]).norm(dim=-1), rtol=1e-5, atol=1e-5)
        cos = torch.nn.functional.cosine_similarity(X[b], X[a], dim=-1).clamp(-1, 1)
        torch.testing.assert_close(w.step_angle[b], torch.rad2deg(torch.arccos(cos)), rtol=1e-3, atol=1e-2)
    contrib = [i for i, p in enumerate(tr.points) if not w.residual[i]]
    assert contrib and torch.isnan(w.step_length[contrib]).all()
    assert torch.isnan(w.step_length[res[0]]).all()


def test_escape_points_by_definition():
    lm, tr = tiny("falcon_seq")
    w = walklens.encoding_walk(tr, k=2, norm="final")
    res = [i for i, r in enumerate(w.residual) if r]
    T = len(tr.tokens)
    seen_escape = False
    for t in range(T):
        first = next((i for i in res if 0 <= w.rank_of_next[i, t] < w.rank_of_input[i, t]), -1)
        assert int(w.escape_point[t]) == first
        stable = -1
        for j, i in enumerate(res):
            if all(0 <= w.rank_of_next[q, t] < w.rank_of_input[q, t] for q in res[j:]):
                stable = i
                break
        assert int(w.escape_stable[t]) == stable
        seen_escape |= first >= 0
    assert seen_escape  # the check above is not vacuous
    assert int(w.escape_point[-1]) == -1


def test_final_point_is_not_normed_twice():
    """HF's 'final' already is the final norm's output; the lens must not apply it again (tuned-lens trap)."""
    lm, tr = tiny("llama")
    w = walklens.encoding_walk(tr, k=3, norm="final")
    last = w.point_index(f"L{tr.n_layers - 1}.resid_post")
    fi = w.point_index("final")
    # norm(resid_post of the last layer) == final: its top tokens are final's, but for float near-ties
    assert_topk_match(w.top_ids[last], brute_scores(lm, tr, "dot", "final")[fi], "normed last layer vs final")
    twice = final_norm_fn(lm)(tr["final"])
    assert not torch.allclose(twice, tr["final"].float(), atol=1e-3)  # applying it twice would differ


def test_points_selection_and_against():
    lm, tr = tiny("gpt_neox")  # untied: V != W_U
    w = walklens.encoding_walk(tr, k=2, points="residual")
    assert all(w.residual) and w.points[0] == "embed"
    a = walklens.encoding_walk(tr, k=2, norm="none", against="unembed", points=["final"])
    WU = get_module(lm.model, lm.adapter.unembed).weight.detach().float()
    assert not torch.equal(WU, lm.embedding_matrix().detach().float())
    assert_picks_match(a.top_ids[0, :, 0], tr["final"].float() @ WU.T, "against W_U")
    assert "W_U" in a.matrix and w.matrix == "V"


def test_albert_e_space_is_a_clear_error_and_lens_works():
    lm, tr = tiny("albert")
    with pytest.raises(InputError, match="E-space"):
        walklens.encoding_walk(tr, norm="none")
    w = walklens.encoding_walk(tr, k=2, norm="final", metric="cosine")
    assert w.top_ids.shape[-1] == 2 and (w.top_scores <= 1 + 1e-5).all()


@pytest.mark.parametrize(
    "bad", [dict(metric="l2"), dict(norm="layer"), dict(k=-1), dict(k=True), dict(against="x"), dict(points=["nope*"])]
)
def test_bad_options(bad):
    _, tr = tiny("llama")
    with pytest.raises(InputError):
        walklens.encoding_walk(tr, **bad)


# ---- similarity maps -------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["embed", "L1.resid_post", "final", "V"])
def test_similarity_map(point):
    lm, tr = tiny("llama")
    c = walklens.similarity_map(tr, point, metric="cosine")
    T = len(tr.tokens)
    assert c.shape == (T, T)
    torch.testing.assert_close(c, c.T)
    torch.testing.assert_close(c.diagonal(), torch.ones(T))
    d = walklens.similarity_map(tr, point, metric="dot")
    X = lm.embedding_matrix().detach().float()[tr.token_ids] if point == "V" else tr[point].float()
    torch.testing.assert_close(d, X @ X.T)
    n = walklens.similarity_map(tr, point, metric="dot", normed=True)
    Xn = X if point == "final" else final_norm_fn(lm)(X)
    torch.testing.assert_close(n, Xn @ Xn.T, rtol=1e-4, atol=1e-4)
    if point != "final":
        assert not torch.allclose(n, d)


def test_grading_prompt_is_bundled():
    text = resources.files("walklens").joinpath("examples/grading_prompt.txt").read_text(encoding="utf-8")
    assert text.startswith("Grade answers\n") and text.rstrip().endswith("G:\nL:")
    assert text.count("\nA:\n") == 7 and text.count("\nG: ") == 6  # 6 graded answers + the query (A.4)


# ---- decoding walk ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", [f for f in TINY_FAMILIES if f not in ("bert", "albert")])
def test_greedy_decoding_walk_reproduces_generate(family):
    """Every family that generates: the walk is greedy decoding, d_t through the head gives its tokens and top
    probabilities, and model.generate takes the same path."""
    lm, _ = tiny(family)
    prompt = "the capital of france"
    dw = walklens.decoding_walk(lm, prompt, max_new_tokens=6)
    ids = tokenize(lm, prompt)
    with torch.no_grad():
        g = lm.model.generate(ids, max_new_tokens=6, do_sample=False)[0]
    g = g[ids.shape[1] :] if lm.adapter.auto_class == "causal" else g[1:]
    assert (dw.ranks == 0).all() and torch.equal(dw.token_ids, dw.greedy_ids)
    # d_t through the model's own head gives the recorded top tokens (but for float near-ties)
    with torch.no_grad():
        lg = lm.adapter.logits(lm.model, dw.d).float()
    assert_picks_match(dw.greedy_ids, lg, "greedy ids")
    # generate() takes the same path; at a near-tie the two may part (and then differ), nowhere else
    n = min(len(g), len(dw.token_ids))
    diff = (g[:n] != dw.token_ids[:n]).nonzero()
    if len(diff):
        t = int(diff[0])
        assert near(lg[t, g[t]], lg[t].max()), (t, g.tolist(), dw.token_ids.tolist())
    else:
        assert len(g) == len(dw.token_ids)
    torch.testing.assert_close(lg.softmax(-1).gather(1, dw.top_ids), dw.top_probs, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(lg.softmax(-1).gather(1, dw.top_ids), dw.top_probs, rtol=1e-4, atol=1e-6)


def test_sampled_walk_ranks_match_a_full_forward():
    """Sampling with a seed: reproducible, and every recorded rank/prob matches a cache-free forward pass."""
    lm, _ = tiny("llama")
    prompt = "the king"
    a = walklens.decoding_walk(lm, prompt, max_new_tokens=8, sample=True, seed=1, temperature=1.5, stop_at_eos=False)
    b = walklens.decoding_walk(lm, prompt, max_new_tokens=8, sample=True, seed=1, temperature=1.5, stop_at_eos=False)
    assert torch.equal(a.token_ids, b.token_ids)
    ids = tokenize(lm, prompt)
    full = torch.cat([ids[0], a.token_ids])
    with torch.no_grad():
        lg = lm.model(input_ids=full[None]).logits[0].float()
    n0 = ids.shape[1] - 1
    steps = lg[n0 : n0 + len(a.token_ids)]
    assert_ranks_match(a.ranks, steps, a.token_ids, "sampled ranks")  # equal but for float near-ties
    torch.testing.assert_close(steps.softmax(-1).gather(1, a.token_ids[:, None])[:, 0], a.probs, rtol=1e-4, atol=1e-6)
    assert (a.ranks > 0).any()  # temperature 1.5 on a random model leaves the greedy path somewhere
    one = walklens.decoding_walk(lm, prompt, max_new_tokens=5, sample=True, seed=7, top_k=1)
    greedy = walklens.decoding_walk(lm, prompt, max_new_tokens=5)
    assert torch.equal(one.token_ids, greedy.token_ids)


def test_target_path():
    lm, _ = tiny("llama")
    greedy = walklens.decoding_walk(lm, "the king", max_new_tokens=4, stop_at_eos=False)
    on = walklens.decoding_walk(lm, "the king", target=greedy.token_ids.tolist())
    assert on.token_ids.tolist() == greedy.token_ids.tolist()
    assert on.in_neighbourhood.all() and on.left_path_at == -1
    # replace the third token by one that is not the nearest: the walk leaves the path there
    ids = greedy.token_ids.tolist()
    off_tok = int(greedy.top_ids[2, 1])
    off = walklens.decoding_walk(lm, "the king", target=ids[:2] + [off_tok] + ids[3:])
    assert off.left_path_at == 2 and int(off.ranks[2]) == 1
    assert off.in_neighbourhood[:2].all() and not off.in_neighbourhood[2]


def test_decoding_walk_errors():
    lm, _ = tiny("bert")
    with pytest.raises(InputError, match="masked"):
        walklens.decoding_walk(lm, "the king")
    lm, _ = tiny("llama")
    with pytest.raises(InputError):
        walklens.decoding_walk(lm, "the king", max_new_tokens=0)
    with pytest.raises(InputError):
        walklens.decoding_walk(lm, "the king", target="  ")
    with pytest.raises(InputError, match="context"):
        walklens.decoding_walk(lm, "the king", max_new_tokens=100)


def test_teacher_forced_walk_is_one_forward_pass():
    lm, _ = tiny("llama")
    greedy = walklens.decoding_walk(lm, "the king", max_new_tokens=5, stop_at_eos=False)
    calls = []
    with walklens.Hooks() as hooks:
        hooks.pre(lm.model, lambda _m, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
        on = walklens.decoding_walk(lm, "the king", target=greedy.token_ids.tolist())
    P = tokenize(lm, "the king").shape[1]
    assert calls == [torch.Size([1, P + 5 - 1])]  # prompt + target minus its last token, once
    torch.testing.assert_close(on.d, greedy.d, rtol=1e-5, atol=1e-5)  # the same d_t as the cached generation
    torch.testing.assert_close(on.probs, greedy.probs, rtol=1e-4, atol=1e-6)
    assert torch.equal(on.top_ids, greedy.top_ids)


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_free_walk_runs_generate_and_reads_raw_logits(family, monkeypatch):
    """The walk is the model's own generate; processors of its generation config (here a strong repetition
    penalty and a suppressed token) change neither the recorded P_t nor the choice (eq. 12: raw logits)."""
    lm, _ = tiny(family)
    prompt = "the capital of france"
    plain = walklens.decoding_walk(lm, prompt, max_new_tokens=6, stop_at_eos=False)
    calls = []
    real = lm.model.generate
    monkeypatch.setattr(lm.model, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    gc = lm.model.generation_config
    monkeypatch.setattr(gc, "repetition_penalty", 50.0)
    monkeypatch.setattr(gc, "suppress_tokens", [int(plain.token_ids[0])])
    dw = walklens.decoding_walk(lm, prompt, max_new_tokens=6, stop_at_eos=False)
    assert calls == [1]
    assert torch.equal(dw.token_ids, plain.token_ids) and torch.equal(dw.ranks, plain.ranks)
    assert torch.equal(dw.probs, plain.probs) and torch.equal(dw.d, plain.d)


def test_stop_at_eos():
    lm, _ = tiny("llama")
    free = walklens.decoding_walk(lm, "the king", max_new_tokens=6, stop_at_eos=False)
    eos = int(free.token_ids[1])
    gc = lm.model.generation_config
    saved = gc.eos_token_id
    gc.eos_token_id = eos
    try:
        stopped = walklens.decoding_walk(lm, "the king", max_new_tokens=6)
        through = walklens.decoding_walk(lm, "the king", max_new_tokens=6, stop_at_eos=False)
    finally:
        gc.eos_token_id = saved
    assert stopped.stopped_at_eos and stopped.token_ids.tolist() == free.token_ids.tolist()[:2]
    assert not through.stopped_at_eos and torch.equal(through.token_ids, free.token_ids)


# ---- real model (SmolLM2-135M) -------------------------------------------------------------------------------


@pytest.mark.real
def test_real_paris_is_rank_0_next_at_final(smollm2):
    tr = walklens.capture(smollm2, "The capital of France is Paris")
    assert tr.tokens[-2:] == [" is", " Paris"]
    for norm in ("none", "final"):
        w = walklens.encoding_walk(tr, k=10, norm=norm, points="residual")
        fi = w.point_index("final")
        assert int(w.rank_of_next[fi, -2]) == 0
        labels = walklens.analyses.walks.labels_for(smollm2.tokenizer, w.top_ids[fi, -2, :1].tolist())
        assert list(labels.values()) == [" Paris"]
    assert_picks_match(w.top_ids[fi, :, 0], tr.logits(), "real lens vs logits")


@pytest.mark.real
def test_real_greedy_walk_reproduces_generate(smollm2):
    prompt = "The capital of France is"
    dw = walklens.decoding_walk(smollm2, prompt, max_new_tokens=5)
    ids = tokenize(smollm2, prompt)
    with torch.no_grad():
        g = smollm2.model.generate(ids, max_new_tokens=5, do_sample=False)[0, ids.shape[1] :]
    assert dw.token_ids.tolist() == g.tolist()
    assert dw.tokens[0] == " Paris"


# ---- command line ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama saved as a local model directory (safetensors), loadable with --model DIR."""
    lm = tiny_model("llama")
    d = tmp_path_factory.mktemp("tiny-llama")
    lm.model.save_pretrained(str(d), safe_serialization=True)
    lm.tokenizer.save_pretrained(str(d))
    return d


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(capsys, *args: str) -> Result:
    """The command line, in-process (the same main() the console script runs; no interpreter start-up)."""
    from walklens.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse errors
        code = int(e.code)
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


def test_cli_walk_generate_simmap(tiny_dir, tmp_path, capsys):
    out = tmp_path / "walk"
    r = cli(
        capsys,
        "walk",
        "the capital of france is paris",
        "--model",
        str(tiny_dir),
        "--json",
        str(tmp_path / "w.json"),
        "--out",
        str(out),
        "--k",
        "4",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["tokens"][-1] == " paris" and data["walks"]["final"]["rank_of_next"][-1][-1] == -1
    top = data["walks"]["final"]["top_ids"]
    assert len(top[0][0]) == 4 and all(str(i) in data["labels"] for i in top[-1][0])
    html = (out / "index.html").read_text()
    assert "<script>" in html and not re.search(r"<script[^>]*\bsrc=", html)  # inline JS only
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from the network
    assert (out / "rank_next_final.png").stat().st_size > 1000
    assert "capital" in r.stdout  # the terminal table

    r = cli(
        capsys,
        "generate",
        "the capital of",
        "--model",
        str(tiny_dir),
        "--max-new-tokens",
        "3",
        "--json",
        str(tmp_path / "g.json"),
        "--out",
        str(tmp_path / "gen"),
    )
    assert r.returncode == 0, r.stderr
    g = json.loads((tmp_path / "g.json").read_text())
    assert len(g["tokens"]) == len(g["ranks"]) <= 3 and (tmp_path / "gen" / "index.html").is_file()

    r = cli(
        capsys,
        "simmap",
        "the capital of france",
        "--model",
        str(tiny_dir),
        "--point",
        "embed",
        "--point",
        "final",
        "--json",
        str(tmp_path / "s.json"),
        "--out",
        str(tmp_path / "sim"),
    )
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    m = s["maps"]["final/cosine"]
    assert len(m) == 4 and abs(m[1][1] - 1) < 1e-5 and (tmp_path / "sim" / "index.html").is_file()


@pytest.mark.parametrize(
    "args,msg",
    [
        (("simmap", "the king", "--point", "L99.resid_post"), "no captured point"),
        (("walk", "the king", "--k", "0"), "k must be"),
        (("generate", "the king", "--max-new-tokens", "0"), "max_new_tokens"),
    ],
)
def test_cli_errors_one_line(tiny_dir, args, msg, capsys):
    r = cli(capsys, *args, "--model", str(tiny_dir))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("walklens:")]
    assert len(lines) == 1 and msg in lines[0], r.stderr


@pytest.mark.parametrize("family", ["t5", "albert"])
def test_cli_walk_encoder_decoder_and_e_space(family, tmp_path, capsys):
    """T5: the report holds the encoder and the decoder walks (A.2); ALBERT: the raw reading is skipped with
    a note (V lives in E-space) and the lens reading is reported."""
    lm = tiny_model(family)
    d = tmp_path / family
    lm.model.save_pretrained(str(d), safe_serialization=True)
    lm.tokenizer.save_pretrained(str(d))
    r = cli(
        capsys,
        "walk",
        "the capital of france",
        "--model",
        str(d),
        "--json",
        str(tmp_path / "w.json"),
        "--out",
        str(tmp_path / "out"),
        "--k",
        "3",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "w.json").read_text())
    html = (tmp_path / "out" / "index.html").read_text()
    if family == "t5":
        assert set(data["walks"]) == {"none", "final"}
        enc = data["walks"]["final"]["encoder"]
        assert len(enc["rank_of_input"][0]) == len(enc["tokens"]) and "Encoder walk" in html and "Decoder walk" in html
        assert (tmp_path / "out" / "rank_next_enc_final.png").is_file()
    else:
        assert set(data["walks"]) == {"final"} and "E-space" in r.stderr
