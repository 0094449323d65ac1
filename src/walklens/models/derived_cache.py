"""The derived-adapter cache: the roles confirmed for one checkpoint (:mod:`.derive`), kept as one JSON entry so
that later loads skip the probe.

An entry is an input like any other, checked before use: read through :mod:`walklens.base.records` (a regular file of
at most :data:`MAX_ENTRY` bytes, shallow JSON), against its declared :data:`ENTRY` schema and its digest (the roles
the probe confirmed cannot be confirmed again without it: an entry changed since it was written fails its digest),
then against the model itself: the fields the module names and the config give must equal the model's
(:func:`~.derive.static_roles`), and every other module path must name a submodule of the expected kind (no private
or dunder attribute is ever followed).  A bad entry raises :class:`~walklens.base.errors.InputError`; the loader then
derives the roles again, with one warning line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any, cast, get_args

from torch import nn

from ..base.errors import InputError
from ..base.numbers import Range
from ..base.records import Field, Schema, read_json
from .base import IDENTITIES, HFModule, Position
from .derive import LOGIT_SCALES, _is_norm, static_roles
from .heads import LAYOUTS
from .roles import Roles

#: Bumped when an entry's fields change: an entry of another version is never read (its key differs).
VERSION = 2
MAX_ENTRY = 256 * 2**10
MAX_PATH = 300
_COUNT = Range(1, 2**20, integer=True)
_NORMS = ("attn", "mlp", "attn_post", "mlp_post")
_PART = re.compile(r"[A-Za-z][A-Za-z0-9_]*|[0-9]+")


def _path(name: str, nullable: bool = False) -> Field:
    return Field(name, "str", nullable=nullable, max_len=MAX_PATH)


ENTRY = Schema(
    "derived-adapter cache entry",
    (
        Field("version", "int", Range(VERSION, VERSION, integer=True)),
        Field("digest", "str", max_len=64),
        _path("model_type"),
        *(_path(n) for n in ("embed", "unembed", "layers", "attn", "mlp", "attn_out", "mlp_out", "final_norm")),
        *(_path(n) for n in ("q", "k", "v", "o")),
        Field("norms", "dict"),
        Field("residual", "str", choices=("pre_norm", "parallel")),
        Field("position", "str", choices=get_args(Position)),
        Field("layout", "str", choices=("separate", *LAYOUTS)),
        Field("conv1d", "bool"),
        Field("n_heads", "int", _COUNT),
        Field("n_kv_heads", "int", _COUNT),
        Field("d_head", "int", _COUNT),
        Field("scale", "float", Range(0, open_lo=True)),
        _path("n_layers_attr"),
        _path("act_attr"),
        _path("act_module", nullable=True),
        _path("softcap_attr", nullable=True),
        Field("logit_scale", "list", nullable=True, max_len=2),
        Field("qk_norm", "bool"),
        Field("limits", "dict"),
    ),
)


def entry_name(model_type: str, key: str) -> str:
    """The file name of the entry of a checkpoint (``key``: a digest of its config and weight files)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_type)[:64]
    digest = hashlib.sha256(f"v{VERSION}|{key}".encode()).hexdigest()[:16]
    return f"{safe}-{digest}.json"


def _digest(fields: dict[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_text(roles: Roles) -> str:
    """The JSON entry of confirmed roles: their fields, the format's version and their digest."""
    fields = json.loads(json.dumps(dataclasses.asdict(roles)))
    return json.dumps({"version": VERSION, **fields, "digest": _digest(fields)}, indent=1)


def read_entry(path: Path, model: HFModule) -> Roles:
    """The roles kept in the entry at ``path``, checked (see the module docstring) against ``model``; one
    :class:`InputError` line naming the entry and what is wrong with it."""
    where = f"the derived-adapter cache entry {path}"
    rec = ENTRY.check(read_json(path, "the derived-adapter cache entry", MAX_ENTRY, max_depth=4), where)
    fields = {f.name: rec[f.name] for f in dataclasses.fields(Roles)}
    if rec["digest"] != _digest(fields):
        raise InputError(f"{where}: its digest does not match its roles (changed since it was written)")
    scale = fields["logit_scale"]
    if scale is not None:
        if tuple(scale) not in LOGIT_SCALES:
            raise InputError(f"{where}: field 'logit_scale' is not one of the logit scales walklens knows")
        fields["logit_scale"] = tuple(scale)
    for name, allowed in (("norms", _NORMS), ("limits", tuple(IDENTITIES))):
        for k, v in fields[name].items():
            if k not in allowed or not isinstance(v, str) or len(v) > 2000:
                raise InputError(f"{where}: field {name!r} holds {str(k)[:40]!r}, not one of {', '.join(allowed)}")
    roles = Roles(**fields)
    check_roles(roles, model, where)
    return roles


def check_roles(roles: Roles, model: HFModule, where: str) -> None:
    """Refuse roles the model contradicts: a field the names and the config give that differs from the model's,
    or a module path that names no submodule of the expected kind."""
    for name, value in static_roles(model).items():
        if getattr(roles, name) != value:
            raise InputError(f"{where}: field {name!r} is {getattr(roles, name)!r}, the model gives {value!r}")
    if (roles.layout == "separate") != (roles.k != ""):
        raise InputError(f"{where}: field 'layout' is {roles.layout!r}, the attention's projections are not")
    layers = cast(nn.ModuleList, submodule(model, roles.layers, where, "layers", nn.ModuleList))
    if len(layers) == 0:
        raise InputError(f"{where}: field 'layers' ({roles.layers!r}) names an empty list")
    layer = layers[0]
    for field in ("attn", "mlp", "attn_out", "mlp_out"):
        submodule(layer, getattr(roles, field), where, field)
    for field, norm in roles.norms.items():
        submodule(layer, norm, where, f"norms.{field}", norm=True)
    submodule(model, roles.final_norm or "", where, "final_norm", norm=True)
    outs = {"attn_out": roles.norms.get("attn_post", roles.attn), "mlp_out": roles.norms.get("mlp_post", roles.mlp)}
    for field, expected in outs.items():
        if getattr(roles, field) != expected:
            raise InputError(f"{where}: field {field!r} is {getattr(roles, field)!r}, its norms give {expected!r}")


def submodule(
    root: nn.Module, path: str, where: str, field: str, kind: type[nn.Module] = nn.Module, norm: bool = False
) -> nn.Module:
    """The submodule at the dotted ``path`` below ``root``, walking registered children only (an attribute that
    is not a submodule, private or dunder, is never followed), of type ``kind`` (and a norm, with ``norm``)."""
    m: Any = root
    for part in path.split(".") if path else []:
        if not _PART.fullmatch(part) or part not in m._modules or m._modules[part] is None:
            raise InputError(f"{where}: field {field!r} ({path[:80]!r}) names no submodule of the model")
        m = m._modules[part]
    if not isinstance(m, kind) or (norm and not _is_norm(m)):
        what = "a norm" if norm else kind.__name__
        raise InputError(f"{where}: field {field!r} ({path[:80]!r}) names a {type(m).__name__}, not {what}")
    return m


__all__ = ["MAX_ENTRY", "VERSION", "check_roles", "entry_name", "entry_text", "read_entry", "submodule"]
