"""The associative organisation, measured (walklens.analyses.association; seed 000, sec. 2.2, Result 4, Figs. 3, 11,
12): each statistic against an independent oracle on synthetic cases with a known answer, and the commands'
one-line errors (`walklens simmap --blocks`, `walklens cooccur`)."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from _cli import run as run_cli
from walklens.analyses.association import (
    block_contrast,
    cooccurrence,
    pair_counts,
    partial_spearman,
    spearman,
    token_class,
)
from walklens.lab.claims import CLAIMS, assess

ROOT = Path(__file__).resolve().parents[1]


def _oracle_contrast(m: np.ndarray, labels: list[str], cls: str, keys: list[int]) -> float:
    """Within minus between by explicit loops over the pairs (i != j, different keys)."""
    inside, across = [], []
    for i, j in itertools.permutations(range(len(labels)), 2):
        if keys[i] == keys[j] or labels[i] != cls:
            continue
        (inside if labels[j] == cls else across).append(m[i, j])
    return float(np.mean(inside) - np.mean(across))


def _planted(T: int = 30, gap: float = 1.0, seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    g = torch.Generator().manual_seed(seed)
    labels = ["number"] * 8 + ["bracket"] * 6 + ["word"] * (T - 14)
    m = torch.randn(T, T, generator=g, dtype=torch.float64) * 0.3
    m = (m + m.T) / 2
    m[:8, :8] += gap
    m[8:14, 8:14] += gap
    return m, labels


def test_block_contrast_is_the_loop_oracle_and_finds_planted_blocks() -> None:
    m, labels = _planted()
    keys = list(range(len(labels)))
    keys[1] = keys[0]  # two copies of one token: their pair is left out with `same`
    r = block_contrast(m, labels, same=keys, n_perm=300, n_boot=300)
    for c in r.classes:
        assert math.isclose(c.contrast, _oracle_contrast(m.numpy(), labels, c.cls, keys), abs_tol=1e-12)
        assert math.isclose(c.contrast, c.within - c.between, abs_tol=1e-12)
    num, br, word = r.of("number"), r.of("bracket"), r.of("word")
    assert num.lo < 1.0 + 0.2 and num.hi > 1.0 - 0.2 and num.lo > 0.5  # the planted gap (+ within-noise)
    assert num.p_above < 0.01 and br.p_above < 0.01 and num.contrast > num.null_hi
    assert word.lo < 0 < word.hi and word.p_above > 0.01  # no block planted among the words


def test_block_contrast_on_a_random_map_is_null() -> None:
    m, labels = _planted(gap=0.0, seed=3)
    r = block_contrast(m, labels, n_perm=300, n_boot=300)
    for c in r.classes:
        assert c.lo < 0 < c.hi, c
        assert c.p_above > 0.01, c


def test_token_classes_follow_the_stated_rules() -> None:
    cases = {"5": "number", " 12": "number", "5.0": "number", "((": "bracket", " [": "bracket", "]]": "bracket",
             "\n": "separator", "###": "separator", " **": "separator", ":": "punctuation", " =": "punctuation",
             "?,": "punctuation", " hello": "word", " don't": "word", "x+1": "", " >=": "punctuation"}  # fmt: skip
    assert {t: token_class(t) for t in cases} == cases


def test_spearman_and_partial_spearman_against_oracles() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, 200).astype(float)  # ties
    z = rng.normal(size=200)
    y = x + 2 * z + rng.normal(size=200)
    assert math.isclose(spearman(x, y), spearmanr(x, y).statistic, abs_tol=1e-12)
    # first-order partial correlation of the ranks, by its closed form
    rxy, rxz, ryz = (spearmanr(a, b).statistic for a, b in ((x, y), (x, z), (y, z)))
    closed = (rxy - rxz * ryz) / math.sqrt((1 - rxz**2) * (1 - ryz**2))
    assert math.isclose(partial_spearman(x, y, z[:, None]), closed, abs_tol=1e-10)


def test_pair_counts_are_the_brute_force_counts() -> None:
    docs = [[1, 2, 1, 3, 2], [2, 2, 4], [3, 1]]
    clusters = [0, 1, 0]
    want: Counter[tuple[int, int, int]] = Counter()
    for d, c in zip(docs, clusters):
        for i, j in itertools.combinations(range(len(d)), 2):
            if j - i <= 2 and d[i] != d[j]:
                want[(c, min(d[i], d[j]), max(d[i], d[j]))] += 1
    cl, a, b, n = pair_counts(docs, clusters, 2)
    assert dict(zip(zip(cl.tolist(), a.tolist(), b.tolist()), n.tolist())) == want


def _topic_corpus(seed: int, aligned: bool) -> tuple[list[list[int]], list[int], torch.Tensor]:
    """Documents drawn from 4 topics of 10 tokens each (tokens of a topic co-occur); topic vectors planted near
    one direction per topic (``aligned``) or random."""
    rng = np.random.default_rng(seed)
    docs = [list(rng.integers(0, 10, 12) + 10 * (k % 4)) + list(rng.integers(0, 40, 4)) for k in range(120)]
    g = torch.Generator().manual_seed(seed)
    vec = torch.randn(40, 16, generator=g)
    if aligned:
        vec = vec * 0.3 + torch.randn(4, 16, generator=g).repeat_interleave(10, 0) * 2
    return docs, [k % 12 for k in range(120)], vec


def test_cooccurrence_finds_planted_association_and_not_a_random_one() -> None:
    docs, clusters, vec = _topic_corpus(0, aligned=True)
    r = cooccurrence(docs, vec, clusters=clusters, window=3, min_count=3, n_groups=6, n_matched=3)
    assert r.pmi_cos.lo > 0.3 and r.dot_cos.rho > 0.5
    assert r.excess_cos.lo > 0  # frequency-matched partners (mostly other topics) lose the correlation
    d = np.array([[t for t in doc] for doc in docs], dtype=object)
    assert r.n_tokens == sum(len(x) for x in d) and r.n_clusters == 12
    docs, clusters, vec = _topic_corpus(1, aligned=False)
    null = cooccurrence(docs, vec, clusters=clusters, window=3, min_count=3, n_groups=6, n_matched=3)
    assert null.pmi_cos.lo < 0.1 and abs(null.pmi_cos.rho) < 0.2


def test_cooccurrence_rho_is_scipy_on_the_pmi_it_defines() -> None:
    docs, clusters, vec = _topic_corpus(2, aligned=True)
    r = cooccurrence(docs, vec, clusters=clusters, window=2, min_count=2, n_groups=3, n_matched=1)
    pairs: Counter[tuple[int, int]] = Counter()
    for d in docs:
        for i, j in itertools.combinations(range(len(d)), 2):
            if j - i <= 2 and d[i] != d[j]:
                pairs[(min(d[i], d[j]), max(d[i], d[j]))] += 1
    marg: Counter[int] = Counter()
    for (a, b), n in pairs.items():
        marg[a] += n
        marg[b] += n
    z = 2 * sum(pairs.values())
    keep = [(a, b, n) for (a, b), n in pairs.items() if n >= 2]
    pmi = [math.log(n * z / (marg[a] * marg[b])) for a, b, n in keep]
    cos = [float(torch.cosine_similarity(vec[a], vec[b], dim=0)) for a, b, _ in keep]
    assert r.n_pairs == len(keep)
    assert math.isclose(r.pmi_cos.rho, spearmanr(pmi, cos).statistic, abs_tol=1e-6)


def test_committed_files_read_into_verdicts() -> None:
    for c in CLAIMS:
        if c.measure in ("cooccur", "blocks") and (ROOT / str(c.file)).is_file():
            m, verdict = assess(c, ROOT)
            assert m is not None and verdict and m.lo <= m.value <= m.hi, (c.id, m)
            doc = json.loads((ROOT / str(c.file)).read_text())
            assert str(doc.get("model", doc.get("model_name"))) in m.text


def test_blocks_and_cooccur_refuse_bad_input_in_one_line(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import walklens.cli.common as common

    monkeypatch.setattr(common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    js = str(tmp_path / "a.json")
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n", encoding="utf-8")
    for argv, where in (
        (["cooccur", "--data", str(data), "--json", str(data)], "--json"),
        (["simmap", "the cat", "--blocks", str(tmp_path)], "--blocks"),
        (["simmap", "the cat", "--blocks", "-"], "--blocks"),
        (["simmap", "the cat", "--blocks", js, "--json", js], "--blocks"),
        (["cooccur", "--window", "0"], "--window"),
        (["cooccur", "--groups", "x"], "--groups"),
        (["cooccur", "--groups", "1"], "--groups"),
        (["cooccur", "--matched", "1000"], "--matched"),
        (["cooccur", "--data", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
        (["cooccur", "--json", str(tmp_path)], "--json"),
    ):
        rc, err = run_cli(capfd, *argv, "--model", str(tmp_path / "no-such-model"))
        assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error: ") and where in err[0], (argv, err)


def _ci(c: dict[str, float], v: str = "contrast", fmt: str = "+.3g") -> str:
    return f"{c[v]:{fmt}} [{c['lo']:{fmt}}, {c['hi']:{fmt}}]"


def walks_md_rows() -> list[str]:
    """The rows docs/walks.md's two tables print, from the committed result files."""
    rows = []
    for model in ("smollm2", "gemma3"):
        d = json.loads((ROOT / f"docs/results/simblocks_{model}.json").read_text())
        alpha = 0.05 / len(d["maps"])
        for key, m in d["maps"].items():
            by = {c["cls"]: c for c in m["classes"]}
            cells = [
                _ci(by[k]) + (" *" if by[k]["p_above"] < alpha else "") for k in ("number", "bracket", "separator")
            ]
            rows.append(f"| {d['model']} | {key} | " + " | ".join(cells) + " |")
    for model in ("smollm2", "gemma3"):
        d = json.loads((ROOT / f"docs/results/cooccur_{model}.json").read_text())
        cells = [
            _ci(d[k], "rho", "+.3f")
            for k in ("pmi_cos", "pmi_dot", "dot_cos", "partial_cos", "matched_cos", "excess_cos")
        ]
        rows.append(f"| {d['model_name']} | {d['n_pairs']:,} | " + " | ".join(cells) + " |")
    return rows


def test_walks_md_tables_are_their_files() -> None:
    doc = (ROOT / "docs/walks.md").read_text(encoding="utf-8")
    for row in walks_md_rows():
        assert row in doc, f"docs/walks.md: {row!r} is not its result file's"


def test_verdicts_are_no_stronger_than_interval_and_controls() -> None:
    from walklens.lab.claims import RULES, Measured

    f = {"partial_cos": 0.1, "partial_cos_lo": 0.02, "excess_cos": 0.1, "excess_cos_lo": 0.01}
    rule = RULES["associative"]
    assert rule(Measured("m", 10, 0.2, 0.1, 0.3, "", f), None).startswith("partly")  # one of the defined words
    assert rule(Measured("m", 10, 0.2, 0.1, 0.3, "", f | {"excess_cos_lo": -0.01}), None).startswith("not decided")
    assert rule(Measured("m", 10, 0.2, -0.1, 0.3, "", f), None).startswith("not decided")
    assert rule(Measured("m", 10, -0.2, -0.3, -0.1, "", f), None).startswith("not reproduced")
    blocks = RULES["blocks"]
    facts = {"maps": 6, "number_alike": 6, "bracket_alike": 6, "separator_alike": 0}
    assert blocks(Measured("m", 9, 0.5, 0.4, 0.6, "", facts), None).startswith("reproduced")
    # separators alike no longer lowers the verdict: the seed's light bands are not what the contrast measures
    assert blocks(Measured("m", 9, 0.5, 0.4, 0.6, "", facts | {"separator_alike": 1}), None).startswith("reproduced")
    assert blocks(
        Measured("m", 9, 0.5, 0.4, 0.6, "", facts | {"number_alike": 0, "bracket_alike": 0}), None
    ).startswith("not reproduced")


def test_commands_write_their_json_on_a_tiny_model(
    tiny_llama_inputs: dict[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model, data = tiny_llama_inputs["model"], tiny_llama_inputs["data"]
    blocks, cooc = tmp_path / "b.json", tmp_path / "c.json"
    rc, err = run_cli(capfd, "simmap", "(1, 2) ### 3", "--model", model, "--blocks", str(blocks), "--metric", "cosine")
    assert rc == 0, err
    doc = json.loads(blocks.read_text())
    assert doc["kind"] == "similarity_blocks" and len(doc["classes"]) == len(doc["tokens"]) and doc["maps"]
    rc, err = run_cli(capfd, "cooccur", "--model", model, "--data", data, "--min-count", "1", "--json", str(cooc))
    assert rc == 0, err
    c = json.loads(cooc.read_text())
    assert c["kind"] == "cooccurrence" and c["n_pairs"] >= 3 and c["n_clusters"] == 1
    assert c["pmi_cos"]["lo"] is None  # one cluster: no interval (NaN, written as null), never a made-up one
