"""The registry: every claim of both seeds, read from the data file ``claims.toml`` shipped beside this module and
checked on load against :data:`CLAIM` (a missing or unknown key, a wrong type, a reader or rule that is not one of
:data:`~walklens.lab.claims.readers.MEASURES` / :data:`~walklens.lab.claims.rules.RULES`: one
:class:`~walklens.base.errors.InputError` line naming the claim and the key)."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...base.errors import InputError
from ...base.numbers import Range, kind
from ...base.records import Field, Schema, read_text
from .base import Claim, Cost
from .readers import MEASURES
from .rules import RULES, TAKES_TARGET

#: the registry's data file, shipped in the package (pyproject.toml's package-data)
DATA = Path(__file__).with_name("claims.toml")
#: where every file a claim names lies, relative to the repository (``reproduce --render`` guards it as its input)
RESULTS = "docs/results/"
#: the placeholder of a claim's ``why`` for its measured cost
COST = "{cost}"

_TEXT = 2_000  # the longest seed, command or reason (the longest today: a command of 557)
_PATH = 300
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: a claim's measured cost: its timings file, the section and the line it is read from (:class:`Cost`)
COST_SCHEMA = Schema(
    "cost",
    (Field("timings", "str", max_len=_PATH), Field("entry", "str", max_len=200), Field("line", "str", max_len=80)),
)
#: one ``[[claim]]`` table of the data file (the keys the file's header describes)
CLAIM = Schema(
    "claim",
    (
        Field("id", "str", max_len=80),
        Field("seed", "str", max_len=_TEXT),
        Field("says", "str", max_len=_TEXT),
        Field("command", "str", max_len=_TEXT),
        Field("file", "str", required=False, max_len=_PATH),
        Field("reader", "str", required=False, choices=tuple(MEASURES)),
        Field("select", "dict", required=False, max_len=20),
        Field("rule", "str", required=False, choices=tuple(RULES)),
        Field("target", "float", Range(0, 2), required=False),  # a fraction of the ordinary run
        Field("why", "str", required=False, max_len=_TEXT),
        Field("cost", "dict", required=False),
    ),
)
#: the data file: nothing but its claims
REGISTRY = Schema("claims registry", (Field("claim", "list", max_len=1_000),))


def _result_path(path: str, where: str, key: str) -> str:
    """A file of the committed results: relative, under :data:`RESULTS`, never leading out of it."""
    parts = path.split("/")
    if not path.startswith(RESULTS) or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise InputError(f"{where}: field {key!r} must be a path under {RESULTS} (no '..', '.' or '//'), not {path!r}")
    return path


def _select(value: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The reader's parameters: names and scalar values (a string, an integer or a number)."""
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise InputError(f"{where}: field 'select' holds {k[:40]!r} = {kind(v)}, not a string or a number")
    return dict(value)


def _claim(record: Any, where: str) -> Claim:
    """One ``[[claim]]`` table checked: its keys (:data:`CLAIM`), then how they go together."""
    if isinstance(record, Mapping) and isinstance(record.get("id"), str) and _ID.fullmatch(record["id"]):
        where = f"{where} ({record['id']})"
    r = CLAIM.check(record, where)
    if not _ID.fullmatch(r["id"]):
        raise InputError(f"{where}: field 'id' must be letters, digits, '.', '_' or '-', not {r['id'][:40]!r}")
    if "file" in r:
        _result_path(r["file"], where, "file")
        for key in ("reader", "rule"):
            if key not in r:
                raise InputError(f"{where}: field {key!r} is missing (a claim with a result file names its {key})")
    else:
        for key in ("reader", "select", "rule", "target"):
            if key in r:
                raise InputError(f"{where}: field {key!r} is given but not 'file' (nothing to read it from)")
        if not r.get("why"):
            raise InputError(f"{where}: field 'why' is missing (a claim without a result file says why)")
    rule = r.get("rule", "")
    if rule in TAKES_TARGET and "target" not in r:
        raise InputError(f"{where}: field 'target' is missing (rule {rule!r} compares with the seed's figure)")
    if rule not in TAKES_TARGET and "target" in r:
        raise InputError(f"{where}: field 'target' is given but rule {rule!r} takes none")
    cost = None
    if "cost" in r:
        c = COST_SCHEMA.check(r["cost"], f"{where}: field 'cost'")
        cost = Cost(_result_path(c["timings"], f"{where}: field 'cost'", "timings"), c["entry"], c["line"])
    n = r.get("why", "").count(COST)
    if cost and n != 1:
        raise InputError(f"{where}: field 'why' must hold {COST} once (where its cost goes), not {n} times")
    if not cost and n:
        raise InputError(f"{where}: field 'why' holds {COST} but no field 'cost' says where it is measured")
    return Claim(
        id=r["id"],
        seed=r["seed"],
        says=r["says"],
        command=r["command"],
        file=r.get("file"),
        measure=r.get("reader", ""),
        select=_select(r.get("select", {}), where),
        rule=rule,
        target=r.get("target"),
        why=r.get("why", ""),
        cost=cost,
    )


def parse(text: str, where: str) -> tuple[Claim, ...]:
    """The claims of a registry's text (TOML), every table checked; ``where`` names the file in messages."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{where}: not valid TOML ({str(e)[:200]})") from None
    tables = REGISTRY.check(doc, where)["claim"]
    if not tables:
        raise InputError(f"{where}: holds no [[claim]] table")
    claims = tuple(_claim(t, f"{where}: claim {i + 1}") for i, t in enumerate(tables))
    first: dict[str, int] = {}
    for i, c in enumerate(claims):
        if first.setdefault(c.id, i) != i:
            raise InputError(f"{where}: claim {i + 1} ({c.id}): field 'id' repeats claim {first[c.id] + 1}'s")
    return claims


def load(path: str | os.PathLike[str] = DATA) -> tuple[Claim, ...]:
    """The claims of the registry's data file ``path`` (read through :mod:`walklens.base.records`: a regular file,
    its size capped), every table checked."""
    return parse(read_text(path, "claims registry", max_bytes=2**20), f"claims registry {path}")


CLAIMS: tuple[Claim, ...] = load()
