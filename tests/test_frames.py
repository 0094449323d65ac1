"""Tables as data frames (docs/notebooks.md, "Tables"): every tabular result's ``to_pandas()`` holds the numbers of
its ``--json`` document (the reports' ``document()``, or ``walklens.base.outputs.jsonable``),
``walklens.lab.summarise_db``
reads a results database read-only, and a missing pandas is one line naming the extra."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import walklens
from walklens.base.errors import InputError, MissingDependencyError
from walklens.base.outputs import jsonable
from walklens.testing import tiny_model

pd = pytest.importorskip("pandas")

TEXT = "the cat and the dog walk to the house"


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


# ---- comparing a frame's column with a JSON document's numbers ------------------------------------------------


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flat(item)]
    return [x]


def _cell(v: Any) -> Any:
    """A cell as JSON would hold it: missing (None, NaN, pd.NA) is None, numbers are Python numbers."""
    if v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v)):
        return None
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer, int)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return float(v)
    return v


def same(column: Any, document: Any) -> None:
    """The column's cells, in order, are the document's values (nested lists read in C order)."""
    col = column.tolist() if hasattr(column, "tolist") else column
    got = [_cell(v) for v in _flat(col if isinstance(col, (list, tuple)) else [col])]
    want = [_cell(v) for v in _flat(jsonable(document))]
    assert len(got) == len(want), (len(got), len(want))
    bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, bad[:5]


DOCS = Path(__file__).resolve().parents[1] / "docs" / "notebooks.md"


def _documented_tables() -> dict[tuple[str, str], list[str]]:
    """docs/notebooks.md's "Tables": (result, table) -> the columns it lists."""
    out = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and "`" in cells[3]:
            for table in cells[1].split(", "):
                out[(cells[0], table)] = re.findall(r"`([^`]+)`", cells[3])
    return out


def documented(result: str, table: str, df: Any) -> None:
    """The frame's columns are the ones docs/notebooks.md lists (``X_0``, ``X_1``, ... written ``X_i``; timings
    ``seconds_*``)."""
    cols = []
    for c in df.columns:
        c = "seconds_*" if c.startswith("seconds_") else re.sub(r"_\d+$", "_i", c)
        if c not in cols:
            cols.append(c)
    assert cols == _documented_tables()[(result, table)], (result, table)


def test_same_notices_a_shifted_or_changed_column() -> None:
    """The comparison can fail: rows shifted by one, or one number changed in its last bit, are caught."""
    doc = [[1.0, 2.5], [float("nan"), 4.0]]
    same(pd.Series([1.0, 2.5, None, 4.0]), doc)
    with pytest.raises(AssertionError):
        same(pd.Series([2.5, 1.0, None, 4.0]), doc)
    with pytest.raises(AssertionError):
        same(pd.Series([1.0, np.nextafter(2.5, 3.0), None, 4.0]), doc)


# ---- traces, walks, similarity maps ----------------------------------------------------------------------------


def test_trace_tables_hold_every_vector_and_attention(llama) -> None:
    tr = walklens.capture(llama, TEXT, attentions=True)
    df = tr.to_pandas()
    documented("Trace", "hidden", df)
    same(df["value"], tr.hidden)
    P, T, D = tr.hidden.shape
    assert df["point"].tolist()[:: T * D] == tr.points
    assert df["token"].tolist()[: T * D : D] == tr.tokens
    assert df["layer"].isna().sum() == 2 * T * D  # embed and final have no layer
    att = tr.to_pandas("attentions")
    documented("Trace", "attentions", att)
    for name, a in tr.attentions.items():
        same(att.loc[att["module"] == name, "prob"], a)
    with pytest.raises(InputError, match="its tables: hidden, attentions"):
        tr.to_pandas("nope")


def test_t5_trace_and_walk_carry_both_stacks() -> None:
    t5 = tiny_model("t5")
    tr = walklens.capture(t5, "the cat", decoder_text="a dog")
    df = tr.to_pandas()
    assert df["stack"].drop_duplicates().tolist() == [tr.encoder.stack, tr.stack]
    same(df.loc[df["stack"] == tr.encoder.stack, "value"], tr.encoder.hidden)
    walk = walklens.encoding_walk(tr, k=2, progress=False)
    w = walk.to_pandas()
    same(w.loc[w["stack"] == walk.encoder.stack, "rank_of_next"], walk.encoder.rank_of_next)
    same(w.loc[w["stack"] == walk.stack, "rank_of_next"], walk.rank_of_next)


def test_encoding_walk_frame_is_the_json_document(llama) -> None:
    from walklens.reports.walk import document

    tr = walklens.capture(llama, TEXT)
    walk = walklens.encoding_walk(tr, k=3, progress=False)
    doc = document({"raw": walk}, {}, llama.name, TEXT)["walks"]["raw"]
    df = walk.to_pandas()
    documented("EncodingWalk", "walk", df)
    assert len(df) == len(walk.points) * len(walk.tokens)
    for name in (
        "rank_of_input",
        "rank_of_next",
        "prob_of_input",
        "prob_of_next",
        "dot_input",
        "dot_next",
        "cos_input",
        "cos_next",
        "vector_norm",
        "step_length",
        "step_angle",
    ):
        same(df[name], doc[name])
    for j in range(3):
        same(df[f"top_id_{j}"], [[row[j] for row in pt] for pt in doc["top_ids"]])
        same(df[f"top_score_{j}"], [[row[j] for row in pt] for pt in doc["top_scores"]])
    T = len(walk.tokens)
    same(df["escape_point"][:T], doc["escape_names"])
    same(df["escape_stable"][:T], doc["escape_stable_names"])
    same(df["token_id"][:T], doc["token_ids"])
    same(df["next_token_id"][:T], doc["token_ids"][1:] + [None])
    assert df.attrs["metric"] == "dot" and df.attrs["k"] == 3


def test_similarity_frame_is_the_json_document(llama) -> None:
    from walklens.reports.simmap import document

    tr = walklens.capture(llama, TEXT)
    maps = {"embed/dot": walklens.similarity_map(tr), "final/cosine": walklens.similarity_map(tr, "final", "cosine")}
    doc = document(maps, tr.tokens, tr.token_ids, llama.name, TEXT)
    df = walklens.analyses.similarity_frame(maps, tr.tokens)
    documented("similarity_frame", "map", df)
    for key in maps:
        same(df.loc[df["map"] == key, "similarity"], doc["maps"][key])
    one = walklens.analyses.similarity_frame(maps["embed/dot"])
    assert "map" not in one.columns and one["token_i"].isna().all()
    with pytest.raises(InputError, match="tokens"):
        walklens.analyses.similarity_frame(maps["embed/dot"], tr.tokens[:-1])


def test_decoding_walk_frame_is_the_json_document(llama) -> None:
    from walklens.reports.generate import document

    dw = walklens.decoding_walk(llama, "the king", max_new_tokens=5, k=4, progress=False)
    doc = jsonable(document(dw, llama.name))
    df = dw.to_pandas()
    for col, key in (
        ("rank", "ranks"),
        ("prob", "probs"),
        ("token_id", "token_ids"),
        ("greedy_id", "greedy_ids"),
        ("d_norm", "d_norm"),
        ("step_length", "step_length"),
        ("step_angle", "step_angle"),
        ("token", "tokens"),
    ):
        same(df[col], doc[key])
    for j in range(4):
        same(df[f"top_id_{j}"], [r[j] for r in doc["top_ids"]])
        same(df[f"top_prob_{j}"], [r[j] for r in doc["top_probs"]])
        same(df[f"top_token_{j}"], [r[j] for r in doc["top_tokens"]])
    same(dw.to_pandas("d")["value"], doc["d"])
    same(dw.to_pandas("prompt")["token_id"], doc["prompt_ids"])
    documented("DecodingWalk", "d", dw.to_pandas("d"))
    documented("DecodingWalk", "prompt", dw.to_pandas("prompt"))
    assert df["greedy"].all() and df["in_neighbourhood"].isna().all()
    forced = walklens.decoding_walk(llama, "the king", target=" walks to the river", progress=False)
    fdoc = jsonable(document(forced, llama.name))
    same(forced.to_pandas()["in_neighbourhood"], fdoc["in_neighbourhood"])
    same(forced.to_pandas()["target_id"], fdoc["target_ids"])
    documented("DecodingWalk", "steps", forced.to_pandas())


# ---- attention -------------------------------------------------------------------------------------------------


def test_attention_frames_are_the_json_document(llama) -> None:
    from walklens.reports.heads import document

    ident = walklens.attention_identity(llama, TEXT)
    tr = ident.trace
    hm = walklens.head_matrices(llama, 1)
    views = [walklens.analyses.cluster_view(tr, hm, h, 3) for h in range(hm.n_heads)]
    masses = {"model": walklens.analyses.self_mass(tr)}
    stats = {"model": walklens.analyses.head_stats(llama)}
    doc = jsonable(document(ident, views, masses, stats, llama.name))
    checks = ident.to_pandas()
    documented("IdentityResult", "checks", checks)
    same(checks["name"], list(doc["identity"]))
    same(checks["max_abs_error"], list(doc["identity"].values()))
    same(checks["rel_error"], list(doc["identity_relative"].values()))
    members = pd.concat([v.to_pandas() for v in views])
    same(members["membership"], [c["memberships"] for c in doc["cluster"]])
    for key in ("self_mass", "foreign_mass", "move_distance", "foreign_distance", "cos_query_centroid"):
        same(members.drop_duplicates("head")[key], [c[key] for c in doc["cluster"]])
    vec = views[0].to_pandas("vectors")
    documented("ClusterView", "members", members)
    documented("ClusterView", "vectors", vec)
    same(vec["centroid"], views[0].centroid)
    sm = masses["model"].to_pandas()
    documented("SelfMass", "heads", sm)
    same(sm["mass"], doc["self_mass"]["model"]["mass"])
    same(sm["uniform"], doc["self_mass"]["model"]["uniform"])
    hs = stats["model"].to_pandas()
    documented("HeadStats", "heads", hs)
    for key in ("vo_norm", "qk_norm", "vo_sigma1", "vo_copying"):
        same(hs[key], doc["head_stats"]["model"][key])
    # one module's heads: the same numbers as head_stats's row of that layer; its weights as jsonable has them
    heads = hm.to_pandas()
    documented("HeadMatrices", "heads", heads)
    for key in ("vo_norm", "qk_norm", "vo_sigma1", "vo_copying"):
        same(heads[key], doc["head_stats"]["model"][key][1])
    same(heads["kv_head"], list(hm.kv_head))
    w = hm.to_pandas("weights")
    documented("HeadMatrices", "weights", w)
    wdoc = jsonable(hm)["weights"]
    for name in ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"):
        same(w.loc[w["matrix"] == name, "value"], wdoc[name])
    assert w.loc[w["matrix"] == "b_o", "head"].isna().all()


# ---- kernels ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["t5", "bloom"])
def test_kernel_frames_are_the_json_document(family: str) -> None:
    from walklens.reports.kernels import document

    pk = walklens.position_kernels(tiny_model(family), max_distance=6)
    doc = jsonable(document(pk))
    df, classes = pk.to_pandas(), pk.to_pandas("classes")
    for table in ("kernels", "classes", "fractions", "margin_sweep", "alibi"):
        documented("PositionKernels", table, pk.to_pandas(table))
    for s, sd in zip(pk.stacks, doc["stacks"]):
        rows = df[df["stack"] == s.stack]
        same(rows["value"], sd["values"])
        same(rows["spread"], sd["spread"] if sd["spread"] is not None else [None] * len(rows))
        same(classes.loc[classes["stack"] == s.stack, "label"], sd["labels"])
        fr = pk.to_pandas("fractions")
        fr = fr[fr["stack"] == s.stack]
        same(fr["fraction"], list(doc["fractions"][s.stack or "model"].values()))
        sw = pk.to_pandas("margin_sweep")
        sw = sw[sw["stack"] == s.stack]
        same(sw["fraction"], [list(v.values()) for v in doc["margin_sweep"][s.stack or "model"].values()])
    if doc["alibi_slopes"] is not None:
        same(pk.to_pandas("alibi")["slope"], doc["alibi_slopes"])


# ---- power method, idealised dynamics, steering ----------------------------------------------------------------


def test_power_frames_are_the_json_document(llama) -> None:
    from walklens.analyses.idealised import dynamics, shared_weights
    from walklens.reports.power import document

    spectra = walklens.power_spectra(llama, nearest=3)
    texts = [TEXT, "paris is the capital of france"]
    align = walklens.alignment(llama, texts, spectra=spectra, n_random=8, n_shuffles=4)
    dyn = dynamics(llama, texts[:1])
    sw = shared_weights(llama, texts[:1], layer=0, n_layers=4)
    doc = jsonable(document(spectra, align, dyn, sw, texts))

    for name, result in (("PowerSpectra", spectra), ("Alignment", align), ("Dynamics", dyn), ("SharedWeights", sw)):
        for table in {
            "PowerSpectra": ("layers", "heads", "eigenvalues", "vectors", "tokens"),
            "Alignment": ("points", "tokens"),
            "Dynamics": ("layers",),
            "SharedWeights": ("depths", "fit"),
        }[name]:
            documented(name, table, result.to_pandas(table))
    layers = spectra.to_pandas()
    sd = doc["spectra"]["layers"]
    same(layers["lambda1_re"], [s["eigenvalues"][0][0] for s in sd])
    same(layers["lambda1_im"], [s["eigenvalues"][0][1] for s in sd])
    same(layers["gap"], [s["gap"] for s in sd])
    same(layers["residual_gap"], [s["residual_gap"] for s in sd])
    ev = spectra.to_pandas("eigenvalues")
    own = ev[ev["head"].isna()]
    same(own["re"], [[e[0] for e in s["eigenvalues"]] for s in sd])
    same(own["im"], [[e[1] for e in s["eigenvalues"]] for s in sd])
    same(ev.loc[(ev["layer"] == 1) & (ev["head"] == 2), "re"], [e[0] for e in sd[1]["heads"][2]["eigenvalues"]])
    vec = spectra.to_pandas("vectors")
    for i, s in enumerate(sd):
        mine = vec[(vec["layer"] == spectra.layers[i].layer) & vec["head"].isna()]
        same(mine.loc[mine["vector"] == "v1", "value"], s["v1"])
        same(mine.loc[mine["vector"] == "v1_right", "value"], s["v1_right"])
        same(mine.loc[mine["vector"].str.startswith("basis_"), "value"], s["basis"])
    tok = spectra.to_pandas("tokens")
    same(tok.loc[tok["side"] == "nearest", "cos"], [s["nearest_cos"] for s in sd])
    same(tok.loc[tok["side"] == "nearest", "token"], [s["nearest"] for s in sd])
    same(spectra.to_pandas("heads")["gap"], [[h["gap"] for h in s["heads"]] for s in sd])

    ad = doc["alignment"]
    pts = align.to_pandas()
    for key in (
        "mean",
        "std",
        "random_mean",
        "random_lo",
        "random_hi",
        "other_mean",
        "other_lo",
        "other_hi",
        "shuffled_mean",
        "shuffled_lo",
        "shuffled_hi",
    ):
        same(pts[key], ad[key])
    same(pts["point"], ad["points"])
    same(pts["layer"], ad["layer_of"])
    toks = align.to_pandas("tokens")
    for j in range(len(texts)):
        same(toks.loc[toks["text"] == j, "alignment"], ad["per_token"][j])

    d = dyn.to_pandas()
    for m in dyn.modes:
        same(d.loc[d["mode"] == m, "alignment"], doc["dynamics"]["alignment"][m])
        same(d.loc[d["mode"] == m, "agreement"], doc["dynamics"]["agreement"].get(m, [None] * len(dyn.layers)))
    depths = sw.to_pandas()
    for key in ("measured", "measured_lo", "measured_hi", "power", "residual", "predicted", "predicted_residual"):
        same(depths[key], doc["shared_weights"][key])
    fit = sw.to_pandas("fit")
    for key in ("rate", "rate_residual", "fitted_measured", "fitted_power", "random_mean", "n_tokens"):
        same(fit[key], [doc["shared_weights"][key]])
    same(fit[["lambda1_re", "lambda1_im"]].to_numpy().ravel(), doc["shared_weights"]["lambda1"])


def test_steering_sweep_frame_is_the_json_document(llama) -> None:
    sw = walklens.analyses.steering_sweep(
        llama,
        ["the dog and the", "a big red"],
        " cat",
        [[1], [0, 1]],
        alphas=[0.0, 4.0],
        add_alphas=[2.0],
        max_new_tokens=2,
    )
    doc = jsonable(sw)  # reports/steer.py: the sweep is its own --json document
    df = sw.to_pandas()
    for key in (
        "method",
        "alpha",
        "prompt",
        "target_logit",
        "target_prob",
        "target_rank",
        "top_token",
        "text",
        "perplexity",
        "push",
        "injection",
    ):
        same(df[key], [r[key] for r in doc["rows"]])
    same(df["layers"], [",".join(map(str, r["layers"])) for r in doc["rows"]])
    reach = sw.to_pandas("reach")
    documented("SteeringSweep", "rows", df)
    documented("SteeringSweep", "reach", reach)
    same(reach["layer"], [int(k) for k in doc["reach"]])
    same(reach["reach"], list(doc["reach"].values()))


# ---- the parity card -------------------------------------------------------------------------------------------


def test_parity_card_frame_is_the_json_document(llama) -> None:
    from walklens.analyses.parity import verify
    from walklens.reports.parity import document

    card = verify(llama, texts=("the cat sat on the mat",), quick=True)
    doc = jsonable(document(card))
    df = card.to_pandas()
    for key in ("name", "what", "error", "tolerance", "note"):
        same(df[key], [c[key] for c in doc["checks"]])
    assert [{True: "pass", False: "FAIL"}.get(_cell(v), None) for v in df["passed"]] == [
        c["verdict"] if c["verdict"] in ("pass", "FAIL") else None for c in doc["checks"]
    ]
    detail = card.to_pandas("detail")
    documented("ParityCard", "checks", df)
    documented("ParityCard", "detail", detail)
    base = {"name", "what", "error", "tolerance", "verdict", "note"}
    same(detail["value"], [[v for k, v in c.items() if k not in base] for c in doc["checks"]])
    assert df.attrs["passed"] == doc["passed"]


# ---- compaction ------------------------------------------------------------------------------------------------


def test_compaction_frames_are_the_json_document(llama) -> None:
    from walklens.analyses.compaction import explain

    rep = explain(llama, TEXT + " . the king runs to the city", continuation=" and the queen", budget=3, top=4)
    c = rep.compacted
    doc = jsonable(rep)
    seg = rep.to_pandas()
    same(seg[["start", "end"]].to_numpy(), doc["compacted"]["spans"])
    same(seg["segment"], doc["compacted"]["segments"])
    same(rep.to_pandas("vectors")["value"], doc["compacted"]["vectors"])
    nb = rep.to_pandas("neighbours")
    same(nb["token"], [[t for t, _ in v] for v in doc["neighbours"]])
    same(nb["score"], [[s for _, s in v] for v in doc["neighbours"]])
    cont = rep.to_pandas("continuation")
    same(cont["loglik"], [doc["full"]["loglik"], doc["compact"]["loglik"]])
    same(cont["per_token"], [doc["full"]["per_token"], doc["compact"]["per_token"]])
    assert c.to_pandas().attrs["k"] == c.k == len(seg)
    for table in ("segments", "vectors"):
        documented("Compacted", table, c.to_pandas(table))
    for table in ("segments", "vectors", "neighbours", "continuation"):
        documented("CompactionReport", table, rep.to_pandas(table))


def test_curve_set_frame_is_the_json_document() -> None:
    from walklens.lab.experiments.curves import CurvePoint, CurveSet

    pts = [
        CurvePoint(
            shots=5,
            what="examples",
            strategy=s,
            ratio=r,
            spec=f"{s}:{r}",
            n=40,
            acc=0.3 + i / 10,
            acc_norm=0.31,
            acc_ci=(0.2, 0.4),
            acc_norm_ci=(0.21, 0.41),
            kept_acc=None if i else 0.9,
            kept_acc_ci=(None, None) if i else (0.8, 1.0),
            kept_acc_norm=0.95,
            kept_acc_norm_ci=(0.9, 1.0),
            tokens_per_vector=r,
            seconds={"compact": 1.5} if i else {},
        )
        for i, (s, r) in enumerate([("concept", 2.0), ("avgpool", None)])
    ]
    curves = CurveSet(model="m", n_items=40, n_tune=8, tuned={}, points=pts)
    doc = jsonable(curves)["points"]
    df = curves.to_pandas()
    documented("CurveSet", "points", df)
    for key in (
        "shots",
        "what",
        "strategy",
        "ratio",
        "spec",
        "n",
        "acc",
        "acc_norm",
        "kept_acc",
        "kept_acc_norm",
        "tokens_per_vector",
    ):
        same(df[key], [p[key] for p in doc])
    for key in ("acc", "acc_norm", "kept_acc", "kept_acc_norm"):
        same(df[[f"{key}_lo", f"{key}_hi"]].to_numpy(), [p[f"{key}_ci"] for p in doc])
    same(df["seconds_compact"], [p["seconds"].get("compact") for p in doc])


# ---- runs, sweeps and the results database ---------------------------------------------------------------------


def _items(n: int = 4) -> list[Any]:
    from _toy import ROWS
    from walklens.lab.hellaswag.data import make_item

    return [
        make_item({"activity_label": a, "ctx_a": ca, "ctx_b": cb, "endings": e, "label": l}, i)
        for i, (a, ca, cb, e, l) in enumerate(ROWS[:n])
    ]


def test_run_summary_frame_is_the_json_document(llama) -> None:
    from walklens.lab.experiments.runner import baseline_scorer, run_test
    from walklens.lab.experiments.runsetup import RunSetup

    summary = run_test(llama, _items(), baseline_scorer(), RunSetup(data="toy", progress=False))
    doc = jsonable(summary)
    df = summary.to_pandas()
    for key in ("item", "gold", "pred", "pred_norm"):
        same(df[key], [r[key] for r in doc["results"]])
    same(df[[f"score_{j}" for j in range(4)]].to_numpy(), [r["scores"] for r in doc["results"]])
    assert (df["model"] == doc["key"]["model"]).all() and (df["test"] == "baseline").all()
    same(df["correct"].mean(), [doc["acc"]])
    run = summary.to_pandas("run")
    documented("runner.RunSummary", "items", df)
    documented("runner.RunSummary", "run", run)
    same(run[["n", "acc", "acc_norm"]].to_numpy(), [summary.n, doc["acc"], doc["acc_norm"]])


def _database(path: Path) -> None:
    """A results database with two single runs and one Test 2 sweep of 40 schemes over 30 items."""
    from walklens.lab.hellaswag.store import ItemResult, ResultStore, RunKey, SweepRun, SweepStore

    rng = np.random.default_rng(0)
    with ResultStore(path) as st:
        for test in ("baseline", "test1"):
            key = RunKey("m", "toy", "validation", 0, test, "baseline" if test == "baseline" else "enc=x")
            rs = [
                ItemResult(
                    i,
                    int(rng.integers(4)),
                    int(rng.integers(4)),
                    int(rng.integers(4)),
                    tuple(float(x) for x in rng.normal(size=4)),
                )
                for i in range(5)
            ]
            st.add_results(key, rs)
            st.record_run(key, 5, 0.4, 0.2)
    n = 30
    labels = rng.integers(0, 4, n).astype(np.uint8)
    with SweepStore(path) as sw:
        rid = sw.run_id(
            SweepRun(
                model="m",
                data="toy",
                split="validation",
                shots=0,
                test=2,
                labels=labels,
                item_index=range(n),
                arch="decoder",
                n_layers=4,
            )
        )
        sw.set_baseline(rid, 0.4, 0.35, rng.integers(0, 4, (2, n)).astype(np.uint8))
        groups = []
        for layer in range(5):
            ctx = f"enc=concat_each_example,layer={layer},word=mean,norm=None,seg=mean,ex=mean,sim=dot"
            outs = [f"out_layer={o},out_word={w}" for o in range(4) for w in ("mean", "last")]
            groups.append((ctx, outs, rng.integers(0, 4, (1, len(outs), n)).astype(np.uint8)))
        sw.put_groups(rid, groups, ["acc"], labels, 1.0)


def test_summarise_db_frames_are_the_summary_document(tmp_path: Path) -> None:
    from walklens.lab.experiments.summary import summarise_db as summaries
    from walklens.lab.hellaswag.store import ResultStore, SweepStore

    db = tmp_path / "results.sqlite"
    _database(db)
    before = db.read_bytes()
    frames = walklens.lab.summarise_db(db)
    assert db.read_bytes() == before  # read-only
    assert set(frames) == {
        "runs",
        "results",
        "sweep_runs",
        "schemes",
        "estimates",
        "top10",
        "marginals",
        "folds",
        "distribution",
        "histogram",
    }
    with ResultStore(db, readonly=True) as st:
        runs, items = list(st.iter_rows("runs")), list(st.iter_rows("results"))
    same(frames["runs"]["acc"], [r["acc"] for r in runs])
    same(frames["runs"]["scheme"], [r["scheme"] for r in runs])
    same(frames["results"]["pred"], [r["pred"] for r in items])
    same(frames["results"][[f"score_{j}" for j in range(4)]].to_numpy(), [json.loads(r["scores"]) for r in items])
    with SweepStore(db, readonly=True) as sw:
        (run,) = sw.runs()
        res = sw.load(run["id"], with_preds=False)
    sch = frames["schemes"]
    same(sch["acc"], res.acc)
    same(sch["scheme"], res.schemes)
    assert sch["layer"].tolist()[:8] == ["0"] * 8 and sch["out_word"].tolist()[:2] == ["mean", "last"]
    same(sch["normalised"], res.acc.astype(np.float64) / 0.4)
    same(frames["sweep_runs"][["baseline_acc", "baseline_acc_norm"]].to_numpy(), [0.4, 0.35])

    (summary,) = summaries(db)
    doc = jsonable(summary)["metrics"]["acc"]  # reports/sweep.py: summary.json is jsonable of these
    est = frames["estimates"].set_index("estimate")
    same(
        est.loc["in_sample", ["acc", "lo", "hi", "norm", "norm_lo", "norm_hi"]].to_numpy(),
        [doc["in_sample"][k] for k in ("acc", "lo", "hi", "norm_score", "norm_lo", "norm_hi")],
    )
    same(est.loc["in_sample", "scheme"], [doc["in_sample"]["scheme"]])
    same(est.loc["split", "acc"], [s["acc"] for s in doc["split"]])
    same(
        est.loc["kfold", ["acc", "lo", "hi", "norm"]].to_numpy(), [doc["kfold"][k] for k in ("acc", "lo", "hi", "norm")]
    )
    same(est.loc["baseline", "acc"], [doc["baseline"]])
    same(frames["top10"]["scheme"], [t["scheme"] for t in doc["top10"]])
    same(frames["top10"]["acc"], [t["acc"] for t in doc["top10"]])
    mg = frames["marginals"]
    same(mg["mean"], [[m["mean"] for m in ms] for ms in doc["marginals"].values()])
    same(mg["parameter"], [[p] * len(ms) for p, ms in doc["marginals"].items()])
    same(frames["folds"]["scheme"], doc["kfold"]["fold_schemes"])
    same(frames["folds"]["acc"], doc["kfold"]["fold_acc"])
    same(frames["histogram"]["count"], doc["distribution"]["hist"])
    dist = frames["distribution"]
    same(
        dist[["mean", "chance_upper95", "q50"]].to_numpy(),
        [doc["distribution"]["mean"], doc["distribution"]["chance_upper95"], doc["distribution"]["quantiles"]["q50"]],
    )
    assert (frames["estimates"]["run_id"] == run["id"]).all() and (frames["estimates"]["metric"] == "acc").all()
    # the same tables straight from the run's summary; the columns docs/notebooks.md lists
    assert summary.to_pandas("top10")["scheme"].tolist() == frames["top10"]["scheme"].tolist()
    for table in ("runs", "results", "sweep_runs"):
        documented("summarise_db", table, frames[table])
    assert _documented_tables()[("summarise_db", "schemes")] == [*frames["schemes"].columns]
    for table in ("estimates", "top10", "marginals", "folds", "distribution", "histogram"):
        documented("summary.RunSummary", table, summary.to_pandas(table))
        assert [*frames[table].columns] == ["run_id", *summary.to_pandas(table).columns]
        assert _documented_tables()[("summarise_db", table)] == ["run_id"]


def test_summarise_db_refuses_a_bad_file_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    for path in (bad, tmp_path / "missing.sqlite", tmp_path):
        with pytest.raises(InputError) as info:
            walklens.lab.summarise_db(path)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "missing.sqlite").exists()


def test_summarise_db_of_a_sweep_only_database(tmp_path: Path) -> None:
    from walklens.lab.hellaswag.store import SweepStore

    db = tmp_path / "s.sqlite"
    with SweepStore(db):
        pass
    frames = walklens.lab.summarise_db(db)
    assert frames["runs"].empty and "acc" in frames["runs"].columns and frames["schemes"].empty


# ---- pandas missing --------------------------------------------------------------------------------------------


def test_missing_pandas_is_one_line_naming_the_extra(llama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tr = walklens.capture(llama, TEXT)
    walk = walklens.encoding_walk(tr, k=1, progress=False)
    _database(tmp_path / "r.sqlite")
    monkeypatch.setitem(sys.modules, "pandas", None)
    calls = [
        tr.to_pandas,
        walk.to_pandas,
        lambda: walklens.analyses.similarity_frame(walklens.similarity_map(tr)),
        lambda: walklens.lab.summarise_db(tmp_path / "r.sqlite"),
    ]
    for call in calls:
        with pytest.raises(MissingDependencyError) as info:
            call()
        msg = str(info.value)
        assert "\n" not in msg and "pip install 'walklens[pandas]'" in msg
    # the plain columns need no pandas
    cols = walk._columns()
    assert len(cols["rank_of_next"]) == walk.rank_of_next.numel()


def test_pandas_is_an_optional_extra_and_in_the_test_extra() -> None:
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pandas") for d in extras["optional-dependencies"]["pandas"])
    assert any(d.startswith("pandas") for d in extras["optional-dependencies"]["test"])
    assert not any(d.startswith("pandas") for d in extras["dependencies"])
