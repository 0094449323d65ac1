"""One schema per result document, declared once (:mod:`walklens.reports.schemas`, the lab's by
:mod:`walklens.lab.reports.schemas` into the same registry), and every writer and reader held to it:

* each ``document()`` (and ``*_document()``) writes exactly its declared fields, at every declared depth, on real
  results of a tiny model; the files the claims read (some composed by their commands) hold theirs; every explorer
  reply holds only declared fields;
* every field the report pages' and the explorer's scripts read from a document is declared (``_jsfields``: the
  rule is in its docstring), and every key the claims' readers, the explorer's reducers and the power report's
  figures read (``_reads``: recorded as they read);
* each check is proven able to fail: a read of an undeclared field planted in a copy of a script, or in a reader,
  is reported, and only it;
* one heatmap renderer: ``plots.js`` is the only script that draws on a canvas, and the walk's rank map is drawn by
  one function (``walklensResults.rankMap``) on the report's page and in the explorer.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import walklens.lab  # noqa: F401  # declares the lab's documents
from _explorer import TEST_TEXT, evil_card, sweep_db
from _jsfields import check
from _reads import Reads, checked_by_schemas
from walklens.base.outputs import jsonable
from walklens.lab.claims import readers
from walklens.lab.claims import schemas as sc
from walklens.lab.claims.registry import load
from walklens.lab.reports import curves as curves_report
from walklens.lab.reports import steercard as card_report
from walklens.lab.reports import sweep as sweep_report
from walklens.reports import generate, heads, kernels, parity, power, simmap, steer, walk
from walklens.reports.schemas import DOCUMENTS, REPLIES, ListOf, MapOf, Node, Record, at
from walklens.server import api_walks

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "walklens"
SCRIPTS = [
    *sorted((PACKAGE / "reports" / "assets").glob("*.js")),
    *sorted((PACKAGE / "server" / "static").glob("*.js")),
]


def mismatches(node: Node, value: Any, path: str = "", exact: bool = True) -> list[str]:
    """Where ``value`` (JSON) differs from its declaration: a declared field not written (``exact``), a field
    written and not declared; at every depth the schema declares (``{}``: a map's values, ``[]``: a list's)."""
    if node is None or value is None:
        return []
    if isinstance(node, Record):
        if not isinstance(value, dict):
            return [f"{path or 'the document'}: not an object"]
        out = []
        missing = node.names - node.optional - value.keys()
        if exact and missing:
            out.append(f"{path or 'the document'}: declared, not written: {sorted(missing)}")
        if not node.open and value.keys() - node.names:
            out.append(f"{path or 'the document'}: written, not declared: {sorted(value.keys() - node.names)}")
        for k in node.names & value.keys():
            out += mismatches(node.fields[k], value[k], f"{path}.{k}" if path else k, exact)
        return sorted(set(out))
    if isinstance(node, ListOf) and isinstance(value, list):
        return sorted({m for v in value for m in mismatches(node.of, v, path + "[]", exact)})
    if isinstance(node, MapOf) and isinstance(value, dict):
        return sorted({m for v in value.values() for m in mismatches(node.of, v, path + "{}", exact)})
    return [f"{path}: not a {type(node).__name__}"]


# ---- every document writes exactly its declared fields ---------------------------------------------------------------


def written(r: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Each document function (``module.function``) -> (its kind, what it writes for the results ``r``)."""
    w, pk, card = r["EncodingWalk"], r["PositionKernels"], r["SteeringCard"]
    sm = r["SimilarityMap"]
    spectra, al, dyn, shared = r["PowerSpectra"], r["Alignment"], r["Dynamics"], r["SharedWeights"]
    cells = list(range(len(w.points)))
    csv_rows = list(csv.DictReader(io.StringIO(curves_report.to_csv(r["CurveSet"]))))
    return {
        "walk.document": ("walk", walk.document({"none": w}, w.labels, "m", TEST_TEXT)),
        "walk.walk_document": ("encoding_walk", walk.walk_document(w)),
        "walk.point_document": ("walk_point", walk.point_document(w, 1)),
        "walk.cell_document": ("walk_cell", walk.cell_document(w, 1, 2)),
        "walk.rank_map_document": ("rank_map", walk.rank_map_document(w, w.labels, cells, len(w.tokens))),
        "generate.document": ("decoding_walk", generate.document(r["DecodingWalk"], "m")),
        "simmap.document": ("simmap", simmap.document({"final/dot": sm.plain()}, sm.tokens, w.token_ids, "m", "t")),
        "simmap.view_document": ("simmap_view", simmap.view_document({"final/dot": sm.plain()}, sm.tokens, 1)),
        "heads.document": (
            "heads",
            heads.document(r["IdentityResult"], [r["ClusterView"]], {"m": r["SelfMass"]}, {"m": r["HeadStats"]}, "m"),
        ),
        "heads.cluster_document": ("cluster", heads.cluster_document(r["ClusterView"])),
        "heads.self_mass_document": ("self_mass", heads.self_mass_document(r["SelfMass"])),
        "heads.head_stats_document": ("head_stats", heads.head_stats_document(r["HeadStats"])),
        "kernels.document": ("kernels", kernels.document(pk)),
        "kernels.stack_document": ("kernel_stack", kernels.stack_document(pk.stacks[0])),
        "power.document": ("power", power.document(spectra, al, dyn, shared, ["t"])),
        "power.spectra_document": ("spectra", power.spectra_document(spectra)),
        "power.alignment_document": ("alignment", power.alignment_document(al)),
        "power.dynamics_document": ("dynamics", power.dynamics_document(dyn)),
        "power.shared_document": ("shared_weights", power.shared_document(shared)),
        "steer.document": ("steering", steer.document(r["SteeringSweep"])),
        "parity.document": ("parity", parity.document(r["ParityCard"])),
        "sweep.document": ("sweep", sweep_report.document([r["summary.RunSummary"]], "r.sqlite")),
        "curves.document": ("curves", curves_report.document(r["CurveSet"])),
        "curves.to_csv": ("curves_csv", csv_rows),
        "steercard.document": ("steering_card", card_report.document(card)),
        "steercard.view": ("parts", card_report.view(card)),
        "folds.picks_document": ("folds", _folds_document()),
        "selection.selection_document": ("selection", _selection_document()),
        "PatchResult.document": ("patching", r["PatchResult"].document()),
        "WalkBeside.document": ("walk_beside", r["WalkBeside"].document()),
    }


def _folds_document() -> dict[str, Any]:
    """``walklens hellaswag folds``'s document for a plan of 10 items (a pure function of the picks)."""
    from walklens.lab.experiments.folds import FoldPicks, FoldPlan, picks_document

    plan = FoldPlan(n=10, k=5, seed=0, schemes={"acc": ["s"] * 5})
    picks = FoldPicks(list(range(10)), [0] * 10, {"acc": [0] * 10, "acc_norm": [1] * 10}, {"acc": [0] * 10},
                      {"shuffled": {"acc": [1] * 10}})  # fmt: skip
    head = {k: "x" for k in ("model", "summary_model", "test", "shots", "data", "pool", "command")}
    return picks_document(picks, plan, head, {"acc": {"kfold": {"acc": 1.0}}})


def _selection_document() -> dict[str, Any]:
    """``walklens hellaswag selection``'s document for 4 items and two schemes (a pure function of the picks)."""
    from walklens.lab.experiments.selection import Ranked, SelectionPicks, selection_document

    picks = SelectionPicks(list(range(4)), [0] * 4, {"acc": [0] * 4, "acc_norm": [1] * 4},
                           {s: {"acc": [0] * 4, "acc_norm": [2] * 4} for s in ("a", "b")})  # fmt: skip
    head = {k: "x" for k in ("model", "summary_model", "test", "shots", "data", "pool", "metric", "command")}
    return selection_document(picks, [Ranked(1, "a", 0.5), Ranked(2, "b", 0.4)], {**head, "chosen_on": 4, "skip": 4})


def test_every_document_writes_exactly_its_declared_fields(every_result: dict[str, Any]) -> None:
    docs = written(every_result)
    for name, (kind, doc) in docs.items():
        assert mismatches(DOCUMENTS[kind], jsonable(doc)) == [], name
    assert {k for k, _ in docs.values()} | set(COMMITTED) == set(DOCUMENTS)  # every kind is written somewhere here


def test_every_document_function_is_one_of_those_checked(every_result: dict[str, Any]) -> None:
    """Each ``document``/``*_document`` function of the report modules is in :func:`written`, and each kind a page
    draws (``Report.result(kind, ...)``) is declared."""
    found = set()
    for base in (PACKAGE / "reports", PACKAGE / "lab" / "reports"):
        for path in base.glob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found |= {
                f"{path.stem}.{f.name}"
                for f in tree.body
                if isinstance(f, ast.FunctionDef) and (f.name == "document" or f.name.endswith("_document"))
            }
            kinds = re.findall(r"\.result\(\"(\w+)\"", path.read_text(encoding="utf-8"))
            assert set(kinds) <= set(DOCUMENTS), path
    assert found and found <= set(written(every_result)), found - set(written(every_result))


def test_the_curves_a_document_names_are_its_fields() -> None:
    for kind, curves in (("alignment", power.ALIGNMENT_CURVES), ("shared_weights", power.SHARED_CURVES)):
        for c in curves:
            assert {c["y"], *c.get("band", ())} <= DOCUMENTS[kind].names - {"curves"}, (kind, c)  # type: ignore[union-attr]


#: the files the claims read whose documents their commands compose (the rest are written by ``document()``)
COMMITTED = {
    "cooccur": "cooccur_smollm2.json",
    "similarity_blocks": "simblocks_smollm2.json",
    "self_rank": "selfrank_t5_random.json",
    "kernels_sink": "kernels_smollm2.json",
    "concept_eval": "concept_eval_smollm2.json",
    "hellaswag_run": "test1_fullset/test1_heldout_smollm2_bf16.json",
}


@pytest.mark.parametrize("kind", COMMITTED)
def test_the_files_the_claims_read_hold_their_declared_fields(kind: str) -> None:
    doc = json.loads((ROOT / "docs" / "results" / COMMITTED[kind]).read_text(encoding="utf-8"))
    assert mismatches(DOCUMENTS[kind], doc) == []


# ---- every reply of the explorer holds only declared fields -------------------------------------------------------

HOST, TOKEN = "127.0.0.1:8765", "test-token_0123456789"
ASK = {"model": "llama", "text": TEST_TEXT}
BODIES: list[tuple[str, dict[str, Any] | None]] = [
    ("/api/info", None),
    ("/api/status", None),
    ("/api/sweeps", None),
    ("/api/cards", None),
    ("/api/walk", {"provisional": True}),
    ("/api/walk", {"piece": 0}),
    ("/api/walk", {}),
    ("/api/walk/cell", {"point": 1, "position": 2}),
    ("/api/decode", {"max_new_tokens": 2, "target": " the"}),
    ("/api/simmap", {"point": "final"}),
    ("/api/attention", {}),
    ("/api/kernels", {}),
    ("/api/power", {}),
    ("/api/steer", {"target": " cat", "layers": [1], "alpha": 4.0, "max_new_tokens": 2}),
    ("/api/sweeps/run", {}),
    ("/api/card", {"card": 0}),
    ("/api/patches", None),
    ("/api/patch", {"patch": 0}),
]


def test_every_reply_holds_only_declared_fields(tmp_path: Path, every_result: dict[str, Any]) -> None:
    from walklens.server.app import create_app
    from walklens.server.security import allowed_hosts
    from walklens.server.state import Explorer
    from walklens.testing import tiny_model

    ex = Explorer(
        {"llama": tiny_model("llama")},
        sweep_db(tmp_path / "r.sqlite"),
        cards=[("c.json", evil_card(tmp_path))],
        patches=[("b.json", jsonable(every_result["WalkBeside"].document()))],
    )
    app = create_app(ex, TOKEN, allowed_hosts("127.0.0.1", 8765))
    with TestClient(app, base_url=f"http://{HOST}") as c:
        h = {"X-Walklens-Token": TOKEN}
        run = c.get("/api/sweeps", headers=h).json()["runs"][0]["id"]
        for path, body in BODIES:
            body = {**body, "run": run} if path == "/api/sweeps/run" else body
            r = c.get(path, headers=h) if body is None else c.post(path, json={**ASK, **body}, headers=h)
            assert r.status_code == 200, (path, r.text)
            assert mismatches(REPLIES[path], r.json(), exact=False) == [], path
    routes = re.findall(r"\"(/api/[\w/]+)\"", (PACKAGE / "server" / "app.py").read_text(encoding="utf-8"))
    assert {p for p, _ in BODIES} == set(REPLIES) == set(routes)


# ---- every field a script reads is declared; a planted read is reported ---------------------------------------------


def scripts() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in SCRIPTS}


def test_every_field_a_script_reads_is_declared() -> None:
    flow = check(scripts(), DOCUMENTS, REPLIES)
    assert flow.errors == []
    per_script = {name: {f for s, _, f in flow.checked if s == name} for name in scripts()}
    # the flow reaches every view: the reads it checks (a view it no longer types shrinks these)
    assert len(flow.checked) >= 300 and all(len(per_script[n]) >= 5 for n in ("app.js", "views.js", "walks.js"))
    assert {"rank_of_input", "escape_stable", "columns", "nearest", "curves", "heads", "part"} <= per_script[
        "results.js"
    ]
    assert {"mean_of_heads", "head_output_norm", "norm_score", "marginals", "n_cells"} <= per_script["views.js"]
    assert {"final", "walk_points", "in_neighbourhood", "top_scores", "next_id"} <= per_script["walks.js"]


PLANTS = [  # (script, after this text, the read planted, the one error expected)
    (
        "views.js",
        "c = d.cluster;",
        " var x = d.no_such_field;",
        "reads 'no_such_field', not a field of attention reply",
    ),
    ("views.js", "c = d.cluster;", " var x = c.no_such_field;", "reads 'no_such_field', not a field of cluster view"),
    ("views.js", "var m = d.summary", ", x = m.kfold.no_such_field", "reads 'no_such_field', not a field of HeldOut"),
    ("views.js", "if (!info.db) return;", " if (W.info.no_such_field) return;", "not a field of info"),
    ("results.js", "return [r.method,", " r.no_such_field,", "reads 'no_such_field', not a field of SteerRow"),
    ("results.js", "var L = doc.layers;", " var x = L[0].heads[0].no_such_field;", "not a field of HeadSpectrum"),
    ("results.js", "parts: parts,", " no_such_kind: parts,", "draws 'no_such_kind', not a declared document kind"),
    (
        "results.js",
        "var ranks =",
        " doc.no_such_field ||",
        "reads 'no_such_field', not a field of rank map, walk reply",
    ),
    ("walks.js", 'var WALK_FIELDS = ["tokens",', ' "no_such_field",', "asks for 'no_such_field', not a field of walk"),
    ("walks.js", "rank_of_input: [],", " no_such_field: [],", "sets 'no_such_field', not a field of walk reply"),
    ("walks.js", "var d = dec, out", " = d.no_such_field, o2", "reads 'no_such_field', not a field of decoding reply"),
    (
        "walks.js",
        "return [d.model,",
        " d.final.no_such_field,",
        "reads 'no_such_field', not a field of walk at a point",
    ),
    ("app.js", "return m.name + ", "m.no_such_field + ", "reads 'no_such_field', not a field of model"),
]


@pytest.mark.parametrize("script, anchor, plant, error", PLANTS, ids=[f"{p[0]}:{p[2].strip()}" for p in PLANTS])
def test_a_planted_read_of_an_undeclared_field_is_reported(script: str, anchor: str, plant: str, error: str) -> None:
    src = scripts()
    assert src[script].count(anchor) == 1, anchor
    src[script] = src[script].replace(anchor, anchor + plant)
    line = src[script][: src[script].index(plant)].count("\n") + 1
    errors = check(src, DOCUMENTS, REPLIES).errors
    assert len(errors) == 1 and errors[0].startswith(f"{script}:{line}: ") and error in errors[0], errors


# ---- every key the Python readers read is declared; a planted read is reported --------------------------------------

#: each claims reader -> the kind of the file it reads (by the file's suffix where it reads two)
READS = {
    "heldout": ("sweep", "runs"),
    "scheme_picks": ("hellaswag_run",),
    "standard": ("sweep", "runs"),
    "unique": ("sweep", "runs"),
    "fold_picks": ("folds",),
    "selection_picks": ("selection",),
    "self_bias": ("kernels_sink",),
    "self_rank": ("self_rank",),
    "concept_eval": ("concept_eval",),
    "cooccur": ("cooccur",),
    "blocks": ("similarity_blocks",),
    "steering_card": ("steering_card",),
    "alignment": ("power",),
    "compaction": {".csv": ("curves_csv",), ".json": ("curves",)},
    "self_mass": ("heads",),
}


def claims_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every claim of claims.toml read from its committed file, each file handed over recorded: the key paths read
    that the file's document does not declare."""
    files: dict[Path, Reads] = {}
    real_json, real_csv = sc.load_json, sc.read_csv
    checked_by_schemas(monkeypatch, [sc._Schema])

    def load_json(path: Any) -> Any:
        return files.setdefault(Path(path), Reads()).wrap(real_json(path))

    def read_csv(path: Path, schema: Any) -> Any:
        reads, rows = files.setdefault(Path(path), Reads()), real_csv(path, schema)
        reads.paths |= {(i, n) for i in range(len(rows)) for n in schema.names}  # each row checked by the schema
        return [(w, reads.wrap(r, (i,))) for i, (w, r) in enumerate(rows)]

    monkeypatch.setattr(sc, "load_json", load_json)
    monkeypatch.setattr(sc, "read_csv", read_csv)
    out, kinds = [], {}
    for claim in load():
        if claim.file and (ROOT / claim.file).exists():  # a run under way has no file yet
            files_before = set(files)
            readers.MEASURES[claim.measure](ROOT / claim.file, claim.select)
            assert claim.measure in READS, f"{claim.measure}: which document it reads is not in READS"
            for p in set(files) - files_before | {ROOT / claim.file}:
                how = READS[claim.measure]
                kinds[p] = how[p.suffix] if isinstance(how, dict) else how
    for p, reads in files.items():
        kind = kinds[p]
        out += reads.undeclared(at(DOCUMENTS[kind[0]], *kind[1:]), f"{p.name} ({'.'.join(kind)})")
    assert set(READS) <= {c.measure for c in load() if c.file} and len(files) >= 10
    return out


def test_every_key_the_claims_readers_read_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    assert claims_reads(monkeypatch) == []


def test_a_claims_reader_reading_an_undeclared_key_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real = readers.MEASURES["steering_card"]

    def planted(path: Path, select: Any) -> Any:
        doc = sc.load_json(path)
        assert doc["cells"][0].get("no_such_key") is None
        return real(path, select)

    monkeypatch.setitem(readers.MEASURES, "steering_card", planted)
    out = sorted(claims_reads(monkeypatch))
    cards = sorted(p.name for p in (ROOT / "docs/results/steering/complete").glob("*.json"))
    assert len(cards) >= 3 and out == [f"{name} (steering_card): cells[].no_such_key" for name in cards]


def test_the_claims_schemas_are_parts_of_the_documents() -> None:
    """The fields each claims schema checks (walklens.lab.claims.schemas) are declared where the reader takes them."""
    parts = {
        sc.SWEEP_RUN: ("sweep", "runs", "[]"), sc.SWEEP_METRIC: ("sweep", "runs", "[]", "metrics", "{}"),
        sc.KFOLD: ("sweep", "runs", "[]", "metrics", "{}", "kfold"), sc.COMPACTION_DOC: ("curves",),
        sc.BOOTSTRAP: ("sweep", "runs", "[]", "metrics", "{}", "bootstrap"), sc.COMPACTION_POINT: ("curves_csv", "[]"),
        sc.PAIRED: ("sweep", "runs", "[]", "metrics", "{}", "paired"), sc.HELDOUT_RUN: ("hellaswag_run",),
        sc.HELDOUT_METRIC: ("hellaswag_run", "paired", "acc"), sc.SELF_MASS_DOC: ("heads",),
        sc.SELF_MASS: ("heads", "self_mass", "{}"), sc.ALIGNMENT_DOC: ("power",), sc.ALIGNMENT: ("power", "alignment"),
        sc.STEER_ROW: ("steering", "rows", "[]"), sc.COOCCUR: ("cooccur",),
        sc.CORRELATION: ("cooccur", "pmi_cos"), sc.BLOCKS_DOC: ("similarity_blocks",),
        sc.BLOCK_MAP: ("similarity_blocks", "maps", "{}"), sc.BLOCK_CLASS: ("similarity_blocks", "maps", "{}",
        "classes", "[]"), sc.SELF_BIAS_DOC: ("kernels_sink",), sc.SELF_BIAS: ("kernels_sink", "self_bias", "{}", "[]"),
        sc.SELF_RANK_DOC: ("self_rank",), sc.SELF_RANK: ("self_rank", "stacks", "[]"),
        sc.RANK_SUMMARY: ("self_rank", "stacks", "[]", "summary"), sc.CONCEPT_DOC: ("concept_eval",),
        sc.COMPARISON: ("concept_eval", "comparisons", "{}"), sc.HELDOUT_PICKS: ("hellaswag_run",),
        sc.FOLDS_DOC: ("folds",), sc.SELECTION_DOC: ("selection",),
        sc.STANDARD: ("sweep", "runs", "[]", "metrics", "{}", "standard"),
    }  # fmt: skip
    declared = {v for k, v in vars(sc).items() if k.isupper() and isinstance(v, sc._Schema)}
    assert declared == set(parts), f"not mapped to a document: {[x.name for x in declared - set(parts)]}"
    for schema, (kind, *path) in parts.items():
        node = at(DOCUMENTS[kind], *path)
        assert isinstance(node, Record) and set(schema.names) <= node.names, (
            schema.name,
            set(schema.names) - node.names,
        )


def test_the_explorers_reducers_and_the_power_figures_read_declared_keys(monkeypatch, every_result) -> None:
    """The explorer's reducers (the kernels' mean over heads, the cell's labels, the walk's pick of fields) and the
    power report's figures read their documents by key: each document handed over recorded."""
    from walklens.server import api_heads

    found: list[tuple[Reads, str]] = []

    def record(module: Any, name: str, kind: str) -> None:
        real = getattr(module, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            reads = Reads()
            doc = reads.wrap(real(*a, **k))
            found.append((reads, kind))
            return doc

        monkeypatch.setattr(module, name, wrapped)

    record(api_heads.kernels_report, "document", "kernels")
    record(api_walks.walk_report, "cell_document", "walk_cell")
    record(api_walks.walk_report, "walk_document", "encoding_walk")
    record(api_walks.walk_report, "point_document", "walk_point")
    record(power, "alignment_document", "alignment")
    record(power, "shared_document", "shared_weights")
    client_replies(["/api/kernels", "/api/walk/cell", "/api/walk"])
    r = every_result
    power.build(r["PowerSpectra"], r["Alignment"], r["Dynamics"], r["SharedWeights"]).render()
    assert {k for _, k in found} >= {
        "kernels",
        "walk_cell",
        "encoding_walk",
        "walk_point",
        "alignment",
        "shared_weights",
    }
    assert [m for reads, kind in found for m in reads.undeclared(DOCUMENTS[kind], kind)] == []
    assert set(api_walks.WHOLE_ONLY) <= DOCUMENTS["encoding_walk"].names  # type: ignore[union-attr]


def client_replies(paths: list[str]) -> None:
    from walklens.server.app import create_app
    from walklens.server.security import allowed_hosts
    from walklens.server.state import Explorer
    from walklens.testing import tiny_model

    app = create_app(Explorer({"llama": tiny_model("llama")}), TOKEN, allowed_hosts("127.0.0.1", 8765))
    with TestClient(app, base_url=f"http://{HOST}") as c:
        for path in paths:
            body = {"model": "llama", "text": TEST_TEXT, **(dict(BODIES)[path] or {})}
            assert c.post(path, json=body, headers={"X-Walklens-Token": TOKEN}).status_code == 200, path


# ---- one heatmap renderer -------------------------------------------------------------------------------------------


def canvas_drawers(src: dict[str, str]) -> list[str]:
    """The scripts but plots.js that draw on a canvas or make one."""
    return sorted(
        n for n, s in src.items() if n != "plots.js" and re.search(r"getContext\(|createElement\(\s*[\"']canvas", s)
    )


#: the maps a report's page and the explorer both draw: (results.js's function, its document kind, report module)
SHARED_MAPS = [
    ("rankMap", "rank_map", "walk"),
    ("draw.simmap_view", "simmap_view", "simmap"),
    ("selfMass", "self_mass", "heads"),
    ("headStats", "head_stats", "heads"),
    ("kernelStack", "kernel_stack", "kernels"),
]


def test_one_heatmap_renderer_for_the_reports_and_the_explorer() -> None:
    """plots.js's heatmap is the only canvas renderer (app.js's ``W.heatmap`` wraps it; the cells a view marks
    are marked by plots.js); each map both draw (:data:`SHARED_MAPS`: the walk's rank maps, the similarity maps,
    self mass, the per-head filters, a stack's kernels) is drawn by one function of results.js, from the report's
    document and from the explorer's reply; Python never draws a heatmap but as a spec for plots.js
    (``Report.heatmap``) or a document for results.js (``Report.result``)."""
    src = scripts()
    assert canvas_drawers(src) == []
    assert "window.walklensPlots.heatmap(div)" in src["app.js"]
    for js, kind, module in SHARED_MAPS:  # each drawn by the explorer with the report page's own function
        assert f"W.results.{js}(" in src["walks.js"] + src["views.js"], js
        assert re.search(rf"\b{kind}: \w+,?", src["results.js"]), kind
        assert f'.result("{kind}"' in (PACKAGE / "reports" / f"{module}.py").read_text(encoding="utf-8"), kind
    python = [p for p in PACKAGE.rglob("*.py") if "data-spec" in p.read_text(encoding="utf-8")]
    assert python == [PACKAGE / "reports" / "html.py"]
    src["walks.js"] = src["walks.js"].replace(
        "function walkMap(", 'function own(c) { c.getContext("2d"); }\n  function walkMap('
    )
    assert canvas_drawers(src) == ["walks.js"]  # the check can fail
