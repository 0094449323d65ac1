"""Controls for Tests 1 and 2 (seed 000, sec. 5.1.1-5.1.2): the same scorer on the same items, with the item's
concept vectors replaced, so a Test's accuracy can be told from what its endings carry alone (docs/claims.md,
"Controls").

* ``ending``: ending-only.  The context (few-shot examples included) is replaced by the fixed text
  :data:`NEUTRAL`, composed by the same scheme, so every item sees the same concept vector(s) and only the
  endings differ;
* ``shuffled``: another item's concept vectors.  Item ``i`` gets the context (and the few-shot examples) of its
  donor :func:`donor_index`: a fixed single-cycle permutation (Sattolo's algorithm, seeded by the block) within
  each block of :data:`BLOCK` consecutive items of the file, so the donor comes from the same stretch of the file
  (the same source: ActivityNet or WikiHow) and never is the item itself;
* ``random``: every concept vector replaced by a random direction of the same norm (a Gaussian direction, seeded
  by the item's index).

The verdict "the concept vectors carry the context" is read from the Test against ``shuffled`` (a paired test on
the same items); ``ending`` says how much the endings decide alone, ``random`` how much the vectors' norms do.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from ...base.errors import InputError
from ..hellaswag.data import HellaswagItem

#: the controls, by name (the order their columns take)
CONTROLS = ("ending", "shuffled", "random")
#: the ending-only control's context: a few words that say nothing of any item, the same for every item
NEUTRAL = "Here is what happens next."
#: the shuffled control permutes items within blocks of this many consecutive items of the file
BLOCK = 200
#: the seed of the random-direction control (with the item's index)
RANDOM_SEED = 0


def donor_index(index: int, n_items: int, block: int = BLOCK) -> int:
    """The item whose context item ``index`` gets in the ``shuffled`` control: Sattolo's single-cycle permutation
    of the block of ``block`` consecutive items holding ``index`` (``random.Random(block number)``), so no item
    is its own donor; a last block of one item (a file of ``block * k + 1`` items) joins the block before."""
    if not 0 <= index < n_items:
        raise InputError(f"item {index} is not in a file of {n_items} items")
    start = (index // block) * block
    if n_items - start == 1 and start:
        start -= block
    end = min(start + block, n_items)
    if n_items - end == 1:
        end = n_items
    members = list(range(start, end))
    if len(members) < 2:
        raise InputError("the shuffled control needs at least two items")
    perm = list(members)
    rnd = random.Random(start // block)
    for i in range(len(perm) - 1, 0, -1):  # Sattolo: one cycle through every member
        j = rnd.randrange(i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm[index - start]


def random_like(vectors: torch.Tensor, index: int, seed: int = RANDOM_SEED) -> torch.Tensor:
    """``vectors`` ``[m, D]`` with each row replaced by a Gaussian direction of the row's norm, seeded by the
    item's ``index`` (the same directions whatever batch the item is scored in)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    noise = torch.randn(vectors.shape, generator=g, dtype=torch.float32).to(vectors.device)
    unit = torch.nn.functional.normalize(noise, dim=-1)
    return (unit * vectors.float().norm(dim=-1, keepdim=True)).to(vectors.dtype)


#: a neutral item: the context NEUTRAL and no few-shot example (its endings are never read)
_NEUTRAL_ITEM = HellaswagItem(index=-1, activity_label="", ctx=NEUTRAL, endings=("", "", "", ""), label=0)


@dataclass(frozen=True)
class Control:
    """One control (:data:`CONTROLS`): where an item's context comes from (:meth:`context`) and what happens to
    its concept vectors (:meth:`vectors`).  ``items``: every item of the file by index (the donors);
    ``examples``: the few-shot examples of a donor, as the run draws them."""

    name: str
    items: Mapping[int, HellaswagItem] = field(default_factory=dict)
    n_items: int = 0
    examples: Callable[[HellaswagItem], Sequence[HellaswagItem]] = lambda it: ()

    def __post_init__(self) -> None:
        if self.name not in CONTROLS:
            raise InputError(f"unknown control {self.name!r}; use one of {', '.join(CONTROLS)}")

    def context(
        self, item: HellaswagItem, examples: Sequence[HellaswagItem]
    ) -> tuple[HellaswagItem, Sequence[HellaswagItem]]:
        """The item and the few-shot examples whose context the scheme composes for ``item``."""
        if self.name == "ending":
            return replace(_NEUTRAL_ITEM, split=item.split), ()
        if self.name == "shuffled":
            donor = self.items.get(donor_index(item.index, self.n_items))
            if donor is None:
                raise InputError(f"item {item.index}: its donor is not among the loaded items")
            return donor, self.examples(donor)
        return item, examples

    def vectors(self, item: HellaswagItem, ctx: torch.Tensor) -> torch.Tensor:
        """The concept vectors ``[m, D]`` the scorer uses for ``item`` (random directions for ``random``)."""
        return random_like(ctx, item.index) if self.name == "random" else ctx

    def key(self, scheme: str) -> str:
        """The scheme column of the store key of this control's runs."""
        return f"control={self.name};{scheme}"


def make_control(
    name: str, items: Sequence[HellaswagItem], examples: Callable[[HellaswagItem], Sequence[HellaswagItem]]
) -> Control:
    """The control ``name`` over the file's ``items`` (every item, the donors among them)."""
    return Control(name, {it.index: it for it in items}, len(items), examples)


__all__ = ["BLOCK", "CONTROLS", "NEUTRAL", "Control", "donor_index", "make_control", "random_like"]
