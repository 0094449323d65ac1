"""The A.3 identity checked numerically (seed 000, A.3): every attention module's output recomputed as
``sum_h A_h X W_vo,h + sum_h b_v,h W_o,h + b_o`` from one captured forward pass, against the module's real
output."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, attribute_table, frame, pick
from ...base.hooks import Hooks, distinct, first_output
from ...base.precision import IDENTITY_REL_TOL, dtype_name, is_low_precision, parse_dtype
from ...core.capture import capture
from ...models.base import get_module
from .matrices import HeadMatrices, head_matrices

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ...core.trace import Trace


@dataclass(frozen=True)
class IdentityCheck:
    """One attention module: max |recomputed - real| and the scale of the real output."""

    name: str
    stack: str
    layer: int
    kind: str  # "attn" (self) or "cross"
    max_abs_error: float
    max_abs_output: float

    @property
    def rel_error(self) -> float:
        """max |error| / max |real output|: fp32 rounding of the model itself is ~1e-7 to 1e-6 of this scale."""
        return self.max_abs_error / self.max_abs_output if self.max_abs_output > 0 else float("inf")


@dataclass(frozen=True)
class IdentityResult(Shown, Mapping[str, float], view="identity"):
    """Max absolute error of the A.3 identity per attention module, keyed ``"L{l}.attn"`` (``"enc.L0.attn"``,
    ``"dec.L0.cross"`` for T5), in layer order.  Behaves as a read-only dict name -> error (``res[0]`` is the
    first module's error); ``checks`` has the details, ``trace`` the captured forward pass, ``model_dtype`` the
    dtype the model ran in."""

    checks: tuple[IdentityCheck, ...]
    model_name: str = ""
    tokens: tuple[str, ...] = ()
    trace: Trace | None = field(default=None, repr=False, compare=False)
    model_dtype: str = "float32"

    def __getitem__(self, key: str | int) -> float:
        """Error of module ``key`` (``"L3.attn"``), or of the ``key``-th checked module when an int."""
        if isinstance(key, int):
            return self.checks[key].max_abs_error
        for c in self.checks:
            if c.name == key:
                return c.max_abs_error
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (c.name for c in self.checks)

    def __len__(self) -> int:
        return len(self.checks)

    @property
    def max_error(self) -> float:
        return max(c.max_abs_error for c in self.checks)

    @property
    def max_rel_error(self) -> float:
        """The largest :attr:`IdentityCheck.rel_error` (error over the scale of the module's real output)."""
        return max(c.rel_error for c in self.checks)

    def holds(self, tol: float | None = None) -> bool:
        """Whether the identity holds: ``max_error <= tol`` when ``tol`` is given; else, for a float32 model,
        ``max_error <= 1e-4``, and for a bfloat16 / float16 model ``max_rel_error <=``
        :data:`~walklens.base.precision.IDENTITY_REL_TOL` (8 unit roundoffs of its dtype: 2**-5 in bfloat16)."""
        if tol is not None:
            return self.max_error <= tol
        dtype = parse_dtype(self.model_dtype)
        if is_low_precision(dtype):
            return self.max_rel_error <= IDENTITY_REL_TOL[dtype]
        return self.max_error <= 1e-4

    def _columns(self, table: str = "checks") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        names = ("name", "stack", "layer", "kind", "max_abs_error", "max_abs_output", "rel_error")
        return pick(table, {"checks": lambda: attribute_table(self.checks, names)}, "an IdentityResult")

    def to_pandas(self, table: str = "checks") -> DataFrame:
        """The A.3 identity's errors, one row per attention module (pandas; docs/notebooks.md, "Tables")."""
        return frame(self._columns(table), {"model": self.model_name, "model_dtype": self.model_dtype})


MatricesFn = Callable[[str, int, bool], HeadMatrices]
#: the real outputs of the attention modules, keyed (stack, ``"attn"`` or ``"cross"``), in layer order
Outputs = dict[tuple[str, str], list[torch.Tensor]]


def _identity_key(lm: LoadedModel, stack: str, layer: int, kind: str) -> str:
    return f"{stack}.L{layer}.{kind}" if len(lm.adapter.stacks) > 1 else f"L{layer}.{kind}"


@torch.no_grad()
def attention_identity(
    lm: LoadedModel,
    text: str,
    *,
    decoder_text: str | None = None,
    truncate: bool = False,
    matrices: MatricesFn | None = None,
) -> IdentityResult:
    """Check the A.3 identity ``O = sum_h A_h X W_vo,h + sum_h b_v,h W_o,h + b_o`` on every attention module.

    One forward pass captures, per module, its input X (already normed), its attention probabilities A_h and
    its real output before any post-norm or residual add (``StackSpec.attn_proj_path``: the raw ``self_attn``
    output for Gemma 3, the W_o projection before the LayerNorm for BERT/ALBERT).  The recomputation runs in
    float64 from the captured tensors (recorded in float32, exact for a bfloat16 or float16 model too) and from
    the weights converted to float64 (exact from any dtype), so the error measures the model's own rounding.
    For T5 cross-attention X for keys and values is the encoder's final output.  Returns the max absolute error
    per module (fp32 models hold it to ~1e-6; bfloat16 models to about one bfloat16 unit roundoff, 2**-8, of
    the output's scale: :meth:`IdentityResult.holds` knows the tolerance of each dtype).
    ``matrices(stack, layer, cross)`` overrides where W_vo comes from (tests use it to show a wrong W_vo fails).
    """
    get = matrices or (lambda s, l, c: head_matrices(lm, l, s, c))
    raw, trace = _attention_outputs(lm, text, decoder_text, truncate)
    checks = _identity_checks(lm, trace, raw, get)
    if not checks:
        raise InputError(f"{lm.name}: no attention module outputs were captured")
    return IdentityResult(tuple(checks), lm.name, tuple(trace.tokens), trace, model_dtype=dtype_name(lm.dtype))


def _attention_outputs(lm: LoadedModel, text: str, decoder_text: str | None, truncate: bool) -> tuple[Outputs, Trace]:
    """One forward pass over ``text`` captured with its attention probabilities, and the real output of every
    attention module (``StackSpec.attn_proj_path``, ``cross_proj_path``: before any post-norm or residual add),
    keyed (stack, ``"attn"`` or ``"cross"``), one per use of the module in layer order."""
    raw: Outputs = {}

    def keep(key: tuple[str, str]) -> Callable[[torch.nn.Module, object, object], None]:
        def hook(_m: torch.nn.Module, _inp: object, out: object) -> None:
            raw.setdefault(key, []).append(first_output(out).detach()[0].float().cpu())

        return hook

    with Hooks() as hooks:
        for spec in lm.adapter.stacks:
            for layer_mod in distinct(lm.adapter.layer_modules(lm.model, spec.name)):  # shared: once per use
                hooks.post(get_module(layer_mod, spec.attn_proj_path), keep((spec.name, "attn")))
                if spec.cross_proj_path:
                    hooks.post(get_module(layer_mod, spec.cross_proj_path), keep((spec.name, "cross")))
        trace = capture(lm, text, attentions=True, truncate=truncate, decoder_text=decoder_text)
    return raw, trace


def _identity_checks(lm: LoadedModel, trace: Trace, raw: Outputs, get: MatricesFn) -> list[IdentityCheck]:
    """Each captured output ``raw`` against its A.3 recomputation in float64 from the trace's attention
    probabilities and inputs (T5's cross-attention: keys and values from the encoder's final output)."""
    checks: list[IdentityCheck] = []
    traces = {
        spec.name: (trace.encoder if (trace.encoder is not None and spec is not lm.adapter.stacks[-1]) else trace)
        for spec in lm.adapter.stacks
    }
    for spec in lm.adapter.stacks:
        tr = traces[spec.name]
        for kind in ("attn", "cross"):
            outs = raw.get((spec.name, kind), [])
            for l, real in enumerate(outs):
                A = tr.attentions[f"L{l}.{kind}"]
                X_q = tr.attn_inputs[f"L{l}.{kind}"]
                X_kv = X_q if kind == "attn" else traces[lm.adapter.stacks[0].name]["final"].float()
                hm = get(spec.name, l, kind == "cross")
                rec = hm.to(torch.float64).output(A.double(), X_kv.double())  # float64: only the model rounds
                err = (rec - real.double()).abs().max().item()
                checks.append(
                    IdentityCheck(
                        _identity_key(lm, spec.name, l, kind), spec.name, l, kind, err, real.abs().max().item()
                    )
                )
    return checks
