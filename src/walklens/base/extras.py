"""The optional extras (``[project.optional-dependencies]`` of pyproject.toml) and the one refusal when a
command needs one that is not installed: ``walklens: error: WHAT needs the 'EXTRA' extra (MODULE is not
installed): pip install 'walklens[EXTRA]'``, exit code 2.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

#: each extra and the modules walklens imports from it, in the order they are checked
EXTRAS: dict[str, tuple[str, ...]] = {
    "serve": ("starlette", "uvicorn"),  # walklens serve
    "ray": ("ray",),  # --backend ray, an experiment file's [backend] name = "ray"
    "data": ("pyarrow",),  # hellaswag export FILE.parquet
    "pandas": ("pandas",),  # to_pandas(), summarise_db (walklens.base.frames, a sibling, names it in its own line)
}


def missing_extra(extra: str, what: str, module: str) -> MissingDependencyError:
    """The one-line error: ``what`` needs ``extra``, whose ``module`` is not installed, and how to install it."""
    return MissingDependencyError(
        f"{what} needs the '{extra}' extra ({module} is not installed): pip install 'walklens[{extra}]'"
    )


def require(extra: str, what: str) -> list[ModuleType]:
    """Import every module of ``extra`` (:data:`EXTRAS`), or raise :func:`missing_extra` for the first that
    cannot be imported."""
    modules = []
    for name in EXTRAS[extra]:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            raise missing_extra(extra, what, name) from None
    return modules


__all__ = ["EXTRAS", "missing_extra", "require"]
