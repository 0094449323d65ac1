"""Hook plumbing: forward hooks and pre-hooks on real modules, every one removed on exit, even on error.

Every hook walklens registers goes through :class:`Hooks` (a test checks that no other module registers one):
capture's recorders, the analyses' probes, the probe that confirms a derived adapter
(:mod:`walklens.models.derive`) and the interventions of :mod:`walklens.core.interventions`.  It knows nothing of
models, so it sits at the bottom of the layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import torch
from torch import nn


class Hooks:
    """Forward hooks and pre-hooks on real modules, all removed when the ``with`` block ends (even on error).

    Register inside the block, so that a failure halfway through registration removes what was registered::

        with Hooks() as hooks:
            hooks.post(module, fn)          # fn(module, args, output) -> None or a replacement output
            hooks.pre(module, fn2)          # fn2(module, args) -> None or replacement args
            model(...)
    """

    def __init__(self) -> None:
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def post(self, module: nn.Module, fn: Callable[..., Any], *, always: bool = False) -> None:
        """A forward hook: ``fn(module, args, output)``; a non-None return replaces the output.  ``always``: called
        even when the module's forward raises (then with ``output`` None)."""
        self._handles.append(module.register_forward_hook(fn, always_call=always))

    def pre(self, module: nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        """A forward pre-hook: ``fn(module, args)`` (``fn(module, args, kwargs)`` with ``with_kwargs``)."""
        self._handles.append(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs))

    def remove(self) -> None:
        """Remove every hook registered so far (idempotent)."""
        while self._handles:
            self._handles.pop().remove()

    def __len__(self) -> int:
        return len(self._handles)

    def __enter__(self) -> Hooks:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def distinct(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """Each module once, in order: a shared layer (ALBERT) is hooked once and its hooks fire once per use."""
    return list(dict.fromkeys(modules))


def first_output(x: Any) -> torch.Tensor:
    """The hidden states in a module's output (the first element of a tuple output)."""
    return x[0] if isinstance(x, (tuple, list)) else x


def replace_first(output: Any, new: torch.Tensor) -> Any:
    """A module's output with its hidden states (:func:`first_output`) replaced by ``new``: what a forward hook
    returns to change them."""
    return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new


__all__ = ["Hooks", "distinct", "first_output", "replace_first"]
