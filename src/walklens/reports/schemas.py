"""The declared schema of every result document and of every explorer reply, in one registry: the fields each
holds and, where a reader reads records inside one (a table's rows, a layer's spectrum, a stack's kernels), the
fields of those records.

A document is declared from its result dataclass (:func:`record_of`: ``dataclasses.fields`` and the type hints,
a nested dataclass, or a list or dict of them, a nested record), less what its document function leaves out, plus
what it derives.  So a field added to a result type is declared with no other edit, at any depth.  The instrument's
documents are declared here (:data:`DOCUMENTS`, keyed by kind: the ``kind`` of ``Report.result(kind, doc)`` and of
``walklensResults.draw`` where a page draws one), with the explorer's replies (:data:`REPLIES`, keyed by API path:
a document, or a record holding documents, and the reply's own fields); the lab's are declared by
:mod:`walklens.lab.reports.schemas` into the same registry (the instrument never imports the lab).

``tests/test_schemas.py`` holds every writer and reader to it: each ``document()`` writes exactly its declared
fields; every field the report pages' and the explorer's scripts (``reports/assets/*.js``, ``server/static/*.js``)
read from a document, every key the claims' readers and the explorer's reducers read, and every field a view asks
the API for is declared.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, Union

import torch

from ..analyses.association import BlockContrast, Cooccurrence
from ..analyses.attention import ClusterView, HeadStats, SelfMass
from ..analyses.decoding import DecodingWalk
from ..analyses.encoderself import SelfRank
from ..analyses.idealised import Dynamics, SharedWeights
from ..analyses.kernels import PositionKernels, StackKernels
from ..analyses.kernels.classes import CLASSES, LABELS
from ..analyses.patching import AttributionParity
from ..analyses.power import Alignment, PowerSpectra
from ..analyses.selfbias import SelfBiasCount
from ..analyses.steering import SteeringSweep
from ..analyses.walks import EncodingWalk
from ..analyses.walks.target import TargetAnswer
from .heads import CLUSTER_LEAVE_OUT


@dataclass(eq=False)
class Record:
    """A JSON object's declared fields: name -> what the field holds (a :data:`Node`); ``open``: it may hold more
    keys than declared (names the data chooses, spread into it); ``optional``: declared fields it may lack."""

    name: str
    fields: dict[str, Node] = field(default_factory=dict)
    open: bool = False
    #: the fields a record may leave out (a curve without a band, a part of a page without a table)
    optional: frozenset[str] = frozenset()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.fields)

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    def __repr__(self) -> str:
        return f"Record({self.name!r}, {sorted(self.fields)})"


@dataclass(frozen=True, eq=False)
class ListOf:
    """A JSON list whose elements are ``of`` (None: values a reader reads no field of)."""

    of: Node


@dataclass(frozen=True, eq=False)
class MapOf:
    """A JSON object keyed by names the data chooses (a model's points, a metric's name), each value ``of``."""

    of: Node


#: what a field holds: a record, a list or a map of them, or None (a value: a number, a string, a list of numbers)
Node = Record | ListOf | MapOf | None
N = TypeVar("N", Record, ListOf, MapOf)

VALUE: Node = None
VALUES = ListOf(None)


def _node(tp: Any, seen: dict[type, Record]) -> Node:
    """The node of a type hint: a dataclass a record, a sequence of T a list, a mapping to T a map, else a value."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _node(inner[0], seen) if len(inner) == 1 else None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return record_of(tp, seen=seen)
    if origin is tuple:
        return ListOf(_node(args[0], seen)) if len(args) == 2 and args[1] is Ellipsis else VALUES
    if isinstance(origin, type) and issubclass(origin, (list, Sequence)) and args:
        return ListOf(_node(args[0], seen))
    if isinstance(origin, type) and issubclass(origin, (dict, Mapping)) and len(args) == 2:
        return MapOf(_node(args[1], seen))
    return None


def record_of(
    cls: type,
    name: str = "",
    *,
    leave_out: Iterable[str] = (),
    add: Mapping[str, Node] | None = None,
    seen: dict[type, Record] | None = None,
) -> Record:
    """The record of a result dataclass as :func:`walklens.base.outputs.jsonable` writes it (every public field;
    a nested dataclass, list or dict of them a nested record), less ``leave_out``, plus ``add`` (derived fields).
    A dataclass met again inside itself is the same record (the encoder's walk inside a walk)."""
    seen = {} if seen is None else seen
    if cls in seen and not name and not leave_out and not add:
        return seen[cls]
    rec = Record(name or cls.__name__)
    seen.setdefault(cls, rec)
    hints = typing.get_type_hints(cls)
    skip = set(leave_out)
    for f in dataclasses.fields(cls):
        if not f.name.startswith("_") and f.name not in skip:
            rec.fields[f.name] = _node(hints[f.name], seen)
    rec.fields.update(add or {})
    return rec


def tensors_of(cls: type) -> tuple[str, ...]:
    """The fields of a result dataclass that hold a tensor, in their order."""
    hints = typing.get_type_hints(cls)
    return tuple(f.name for f in dataclasses.fields(cls) if hints[f.name] is torch.Tensor)


def extended(rec: Record, name: str, **more: Node) -> Record:
    """A copy of ``rec`` named ``name`` with the fields ``more`` added (a reply's own fields beside a document's)."""
    return Record(name, {**rec.fields, **more}, rec.open, rec.optional)


def plain(name: str, *names: str, optional: Iterable[str] = (), **nested: Node) -> Record:
    """A record of values named ``names`` and of the nested records ``nested``: a dict a writer builds by hand;
    ``optional``: those it may leave out."""
    return Record(name, {**dict.fromkeys(names), **nested}, optional=frozenset(optional))


#: every document kind: the kind's record (or a list of records, for a document that is a list)
DOCUMENTS: dict[str, Node] = {}
#: every explorer reply, by API path: what the reply holds
REPLIES: dict[str, Record] = {}


def declare(kind: str, node: N) -> N:
    """Declare the document ``kind`` (one declaration per kind)."""
    if kind in DOCUMENTS and DOCUMENTS[kind] is not node:
        raise ValueError(f"the document {kind!r} is declared twice")
    DOCUMENTS[kind] = node
    return node


def reply(path: str, rec: Record) -> Record:
    """Declare what the explorer's API ``path`` replies (one declaration per path)."""
    if path in REPLIES and REPLIES[path] is not rec:
        raise ValueError(f"the reply of {path} is declared twice")
    REPLIES[path] = rec
    return rec


def at(node: Node, *path: str | int) -> Node:
    """The node at ``path`` inside ``node``: a field name in a record, ``"[]"`` (or an index) for a list's
    elements, any key for a map's values; KeyError when the path leaves the declared fields."""
    for step in path:
        if isinstance(node, Record):
            if step not in node.fields:
                raise KeyError(f"{step!r} is not a field of {node.name}")
            node = node.fields[str(step)]
        elif isinstance(node, ListOf) and (step == "[]" or isinstance(step, int)):
            node = node.of
        elif isinstance(node, MapOf):
            node = node.of
        else:
            raise KeyError(f"{step!r}: no record there")
    return node


def undeclared(node: Node, path: Sequence[str | int]) -> str | None:
    """The first step of ``path`` (keys read from a document of ``node``) that is not declared, as
    ``a.b[].c``; None when every step is.  Inside a value or an open record any key is read unchecked."""
    shown = ""
    for step in path:
        if isinstance(node, Record):
            shown += f".{step}" if shown else str(step)
            if step not in node.fields:
                return None if node.open else shown
            node = node.fields[str(step)]
        elif isinstance(node, ListOf) and isinstance(step, int):
            shown, node = shown + "[]", node.of
        elif isinstance(node, MapOf):
            shown, node = shown + "{}", node.of
        else:
            return None
    return None


# ---- the encoding walk (reports/walk.py) --------------------------------------------------------------------------

#: the tensors of a walk with a value per position (not per cell): a cell's document holds them at its position
WALK_PER_POSITION = ("token_ids", "escape_point", "escape_stable")

WALK = declare(
    "encoding_walk",
    record_of(
        EncodingWalk,
        "encoding walk",
        leave_out=("labels",),
        add={"escape_names": VALUES, "escape_stable_names": VALUES},
    ),
)
WALK_POINT = declare(
    "walk_point",
    plain("walk at a point", "point", *(t for t in tensors_of(EncodingWalk) if t not in WALK_PER_POSITION)),
)
WALK_CELL = declare(
    "walk_cell", plain("walk at a cell", "point", "position", "token", "next", "next_id", *tensors_of(EncodingWalk))
)
declare("walk", plain("walk document", "model", "text", "tokens", "token_ids", labels=MapOf(None), walks=MapOf(WALK)))
#: the rank map of a walk the report's page draws (``walklensResults.rankMap``; the explorer draws its reply with it)
RANK_MAP = declare(
    "rank_map",
    plain(
        "rank map",
        "points",
        "columns",
        "block",
        "rank_of_input",
        "rank_of_next",
        "escape_point",
        "escape_stable",
        "nearest",
    ),
)

# ---- decoding walk, similarity map, heads, kernels (reports/generate.py, simmap.py, heads.py, kernels.py) -----------

DECODING = declare(
    "decoding_walk", extended(record_of(DecodingWalk), "decoding walk document", model=VALUE, text=VALUE)
)
SIMMAP = declare("simmap", plain("similarity map document", "model", "text", "tokens", "token_ids", maps=MapOf(None)))
#: the similarity maps a page draws (``walklensResults.draw.simmap_view``; the explorer draws its reply with it)
SIMMAP_VIEW = declare(
    "simmap_view", plain("similarity map view", "labels", "block", "scale", optional=("scale",), maps=MapOf(None))
)

CLUSTER = declare(
    "cluster", record_of(ClusterView, "cluster view", leave_out=CLUSTER_LEAVE_OUT, add={"head_output_norm": VALUE})
)
SELF_MASS = declare("self_mass", record_of(SelfMass))
HEAD_STATS = declare("head_stats", record_of(HeadStats))
declare(
    "heads",
    plain(
        "heads document",
        "model",
        "tokens",
        "encoder_tokens",
        "identity_max",
        identity=MapOf(None),
        identity_relative=MapOf(None),
        cluster=ListOf(CLUSTER),
        self_mass=MapOf(SELF_MASS),
        head_stats=MapOf(HEAD_STATS),
        attentions=MapOf(None),
    ),
)
#: a stack's fraction of kernels in each self-bias class and with each label (``StackKernels.fractions``)
FRACTIONS = plain("fractions", *CLASSES, *(f"label: {label}" for label in LABELS.values()))
STACK = declare(
    "kernel_stack",
    record_of(
        StackKernels, "stack kernels", leave_out=("samples",), add={"labels": ListOf(VALUES), "fractions": FRACTIONS}
    ),
)
KERNELS = declare(
    "kernels",
    record_of(
        PositionKernels,
        "kernels document",
        leave_out=("stacks",),
        add={
            "model": VALUE,
            "fractions": MapOf(FRACTIONS),
            "margin_sweep": MapOf(MapOf(plain("margin", "negative_self", "far_amplifying"))),
            "stacks": ListOf(STACK),
        },
    ),
)
#: ``walklens kernels --sink-control --json``: the kernels document and each control's self-bias counts
declare(
    "kernels_sink",
    extended(KERNELS, "kernels document with sink control", self_bias=MapOf(ListOf(record_of(SelfBiasCount)))),
)

# ---- the power-method view and steering (reports/power.py, steer.py) ---------------------------------------------

#: a curve a document names (``ALIGNMENT_CURVES``, ``SHARED_CURVES``): drawn from the fields it names
CURVE = plain("curve", "name", "y", "band", "dash", optional=("band", "dash"))
SPECTRA = declare("spectra", record_of(PowerSpectra))
ALIGNMENT = declare("alignment", record_of(Alignment, add={"curves": ListOf(CURVE)}))
DYNAMICS = declare("dynamics", record_of(Dynamics))
SHARED = declare("shared_weights", record_of(SharedWeights, add={"curves": ListOf(CURVE)}))
POWER = declare(
    "power",
    plain(
        "power document",
        "model",
        "texts",
        spectra=SPECTRA,
        alignment=ALIGNMENT,
        dynamics=DYNAMICS,
        shared_weights=SHARED,
    ),
)
STEERING = declare("steering", record_of(SteeringSweep))

# ---- the parity card and the files some commands compose (cli/cooccur.py, simmap.py --blocks, walk.py) -------------

CHECK = Record("parity check", dict.fromkeys(("name", "what", "error", "tolerance", "verdict", "note")), open=True)
declare(
    "parity",
    plain(
        "parity card",
        "model",
        "family",
        "derived",
        "dtype",
        "passed",
        "texts",
        limits=MapOf(None),
        checks=ListOf(CHECK),
    ),
)
declare("cooccur", record_of(Cooccurrence, "co-occurrence document", add=dict.fromkeys(("kind", "data", "limit"))))
declare(
    "similarity_blocks",
    plain(
        "similarity blocks document",
        "kind",
        "model",
        "example",
        "tokens",
        "classes",
        "rules",
        maps=MapOf(record_of(BlockContrast)),
    ),
)
#: :meth:`walklens.analyses.encoderself.SelfRank.summary`'s names
SELF_RANK_SUMMARY = (
    "positions",
    "median_rank_own",
    "median_rank_control",
    "top1_own",
    "top10_own",
    "top10_control",
    "mean_cos_own",
    "mean_cos_control",
)
declare(
    "self_rank",
    plain(
        "self-rank document",
        "model",
        "text",
        "encoder_decoder",
        # tokens: optional, as the files written before the strings were kept lack them
        stacks=ListOf(
            replace(
                record_of(SelfRank, add={"summary": plain("rank summary", *SELF_RANK_SUMMARY)}),
                optional=frozenset({"tokens"}),
            )
        ),
    ),
)

# ---- patching (reports/patching.py) --------------------------------------------------------------------------------

#: a grid's fields (PatchResult.document); ``sender``: path patching's (files written before it was kept lack it)
PATCH_FIELDS = (
    "kind model metric direction method points positions tokens clean_tokens values raw clean_metric corrupted_metric "
    "answer_position passes forward_equivalents notes sender"
).split()
PARITY_KIND = plain("parity of a kind", "spearman", "topk_overlap", "cells")
PATCHING = declare(
    "patching",
    plain(
        "patching document",
        *PATCH_FIELDS,
        optional=("sender",),
        parity=record_of(AttributionParity, add={"agrees": VALUE, "by_kind": MapOf(PARITY_KIND)}),
    ),
)
#: the walk beside the test (WalkBeside.document): the restoration curve, the walk's readings, the grid
WALK_BESIDE = declare(
    "walk_beside",
    plain(
        "walk beside the test",
        *"kind model clean corrupted answer other metric layers position restored restored_raw".split(),
        levels=ListOf(plain("restoration level", "level", "layer")),
        readings=ListOf(plain("walk reading", "reading", "name", "point", "layer", "ranks")),
        walks=ListOf(record_of(TargetAnswer)),
        patch=PATCHING,
    ),
)

# ---- the explorer's replies (server/api_*.py, app.py) -------------------------------------------------------------

MODEL_INFO = plain(
    "model", "name", "family", "n_layers", "d_model", "n_heads", "dtype", "kind", "points", "view_tokens"
)
reply("/api/status", Record("status", {}, open=True))  # counts of jobs by outcome
reply("/api/info", plain("info", "db", "cards", "patches", models=ListOf(MODEL_INFO), limits=MapOf(None)))
reply(
    "/api/walk",
    extended(
        WALK,
        "walk reply",
        model=VALUE,
        n_vocab=VALUE,
        block=VALUE,
        columns=VALUE,
        final=WALK_POINT,
        provisional=VALUE,
        point_index=VALUE,
        walk_points=VALUE,
        pieces=VALUE,
        piece=VALUE,
    ),
)
reply("/api/walk/cell", extended(WALK_CELL, "walk cell reply", labels=MapOf(None)))
reply("/api/decode", extended(DECODING, "decoding reply"))
_SIMMAP_REPLY = extended(SIMMAP, "similarity map reply", block=VALUE, labels=VALUE, scale=VALUE)
reply("/api/simmap", Record(_SIMMAP_REPLY.name, _SIMMAP_REPLY.fields, optional=frozenset({"scale"})))  # one map
reply(
    "/api/attention",
    plain(
        "attention reply",
        "model",
        "layer",
        "head",
        "n_heads",
        "n_layers",
        "tokens",
        "block",
        "labels",
        "map",
        cluster=CLUSTER,
        self_mass=SELF_MASS,
        head_stats=HEAD_STATS,
    ),
)
#: a stack of more kernels than the explorer sends holds each layer's mean kernel over ``mean_of_heads`` heads
reply(
    "/api/kernels",
    extended(KERNELS, "kernels reply", stacks=ListOf(extended(STACK, "stack reply", mean_of_heads=VALUE))),
)
reply("/api/power", extended(POWER, "power reply"))
reply("/api/steer", extended(STEERING, "steering reply"))
reply("/api/patches", plain("patching files", patches=ListOf(plain("patching file", "id", "file", "kind", "title"))))
PATCH_REPLY = plain("patching reply", "id", "file", "title", "subtitle", patching=PATCHING, walk_beside=WALK_BESIDE)
reply("/api/patch", replace(PATCH_REPLY, optional=frozenset({"patching", "walk_beside"})))  # one of the two


__all__ = [
    "DOCUMENTS",
    "REPLIES",
    "ListOf",
    "MapOf",
    "Node",
    "Record",
    "at",
    "declare",
    "extended",
    "plain",
    "record_of",
    "reply",
    "tensors_of",
    "undeclared",
]
