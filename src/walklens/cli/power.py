"""``walklens power TEXT...``: spectra of F = W_V W_O, alignment through depth with chance baselines, the
idealised dynamics and the shared-weight experiment, seed 002."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from ..base.numbers import POSITIVE_INT, Range
from ..reports import power as power_report
from .common import add_model_args, add_output_args, load, read_text, seed_arg, write_json
from .limits import add_limit_args
from .terminal import Col, add_command, console, print_table, say

POWER_DESCRIPTION = """\
The power-method view (seed 002): the spectrum of F = W_V W_O of every layer (from the weights), the
alignment of every token of the texts with each layer's principal eigenvector at each layer's input,
mid-residual and output (with 200 random directions, other layers and shuffled layers as baselines),
the idealised dynamics and the shared-weight experiment (the middle layer repeated to the model's depth).
--heads adds every head's W_v,h W_o,h. Memory grows with the tokens of all texts (the baselines keep 200
numbers per token and point); it and the work are checked against --max-memory / --max-work first."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``walklens power``: spectra, alignment through depth, the idealised dynamics and shared weights."""
    p = add_command(
        sub,
        "power",
        "power-method view: spectra of W_V W_O, alignment through depth, shared weights",
        POWER_DESCRIPTION,
    )
    p.add_argument("texts", nargs="*", help="texts (use @FILE to read one from a file)")
    p.add_argument("--corpus", metavar="FILE", help="more texts, one per line")
    p.add_argument("--heads", action="store_true", help="also decompose every head's W_v,h W_o,h")
    p.add_argument("--skip-first", action="store_true", help="leave out each text's first position (attention sink)")
    p.add_argument(
        "--shared-layer",
        type=Range(integer=True).arg(),
        default=None,
        metavar="K",
        help="shared-weight experiment: apply layer K (default: the middle layer) ...",
    )
    p.add_argument(
        "--shared-depth", type=POSITIVE_INT.arg(), default=None, metavar="L", help="... L times (default: model depth)"
    )
    p.add_argument("--no-shared", action="store_true", help="skip the shared-weight experiment")
    p.add_argument("--no-dynamics", action="store_true", help="skip the idealised dynamics")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the random baselines")
    add_model_args(p)
    add_output_args(p)
    add_limit_args(p)
    p.set_defaults(func=run_power)


def _texts(args: argparse.Namespace) -> list[str]:
    texts = [read_text(t) for t in args.texts]
    if args.corpus:
        path = Path(args.corpus)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise InputError("give at least one non-empty text (or --corpus FILE)")
    return texts


def _plan_power(lm: Any, texts: list[str], args: argparse.Namespace) -> None:
    """Refuse, before any computation, a power run over the limits."""
    from ..costs import model_shape, power_need
    from .limits import check, text_tokens

    lengths = [text_tokens(lm, t, False) for t in texts]
    seq2seq = lm.is_encoder_decoder
    need = power_need(
        model_shape(lm),
        lengths,
        heads=args.heads,
        dynamics=not (args.no_dynamics or seq2seq),
        shared=not (args.no_shared or seq2seq),
        json=bool(args.json),
        out=bool(args.out),
        shared_depth=args.shared_depth,
    )
    hint = "fewer or shorter texts, a smaller --shared-depth; --no-dynamics and --no-shared skip those runs" + (
        "; without --heads only whole layers are decomposed" if args.heads else ""
    )
    check(need, args, f"power over {len(texts)} text(s) of {sum(lengths)} tokens (the longest {max(lengths)})", hint)


def run_power(args: argparse.Namespace) -> int:
    from ..analyses.idealised import dynamics, shared_weights
    from ..analyses.power import alignment, power_spectra

    texts = _texts(args)
    lm = load(args)
    if args.shared_layer is not None and not -lm.n_layers <= args.shared_layer < lm.n_layers:
        raise InputError(f"--shared-layer {args.shared_layer} out of range: the model has {lm.n_layers} layers")
    _plan_power(lm, texts, args)
    spectra = power_spectra(lm, heads=args.heads, progress=True)
    al = alignment(lm, texts, spectra=spectra, skip_first=args.skip_first, seed=args.seed, progress=True)
    dyn = (
        None
        if args.no_dynamics or lm.is_encoder_decoder
        else dynamics(lm, texts, spectra=spectra, skip_first=args.skip_first, seed=args.seed, progress=True)
    )
    sw = None
    if not args.no_shared and not lm.is_encoder_decoder:
        k = lm.n_layers // 2 if args.shared_layer is None else args.shared_layer
        sw = shared_weights(
            lm, texts, layer=k, n_layers=args.shared_depth, skip_first=args.skip_first, seed=args.seed, progress=True
        )

    con = console(args)
    _print_layers(con, lm.name, spectra, al)
    say(con, power_report.band_counts(al))
    if sw is not None:
        say(
            con,
            f"shared weights: layer {sw.layer} x {sw.n_layers}: rate |λ2/λ1| = {sw.rate:.3f} "
            f"(I+F: {sw.rate_residual:.4f}); alignment {sw.measured[0]:.3f} -> {sw.measured[-1]:.3f} "
            f"(power method {sw.power[-1]:.3f}, analytic {sw.predicted[-1]:.3f}, random {sw.random_mean:.3f})",
        )
    if args.json:
        write_json(args.json, power_report.document(spectra, al, dyn, sw, texts))
    if args.out:
        say(con, f"report: {power_report.build(spectra, al, dyn, sw).save(args.out)}")
    return 0


def _print_layers(con: Any, model: str, spectra: Any, al: Any) -> None:
    """One row per layer: lambda1 of F = W_V W_O and its gap, the alignment at the layer's output next to the
    random and other-layer baselines, and the tokens nearest v1."""
    rows = []
    for s in spectra.layers:
        i = al.points.index(f"L{s.layer}.resid_post")
        lam = s.lambda1
        rows.append(
            [
                str(s.layer),
                f"{abs(lam):.3g}",
                f"{lam.real:.3g}{lam.imag:+.3g}i" if s.complex_pair else f"{lam.real:.3g}",
                f"{s.gap:.3f}",
                f"{al.mean[i]:.3f}",
                f"{al.random_hi[i]:.3f}",
                f"{al.other_mean[i]:.3f}",
                escape(" ".join(repr(t) for t in s.nearest[:4])),
            ]
        )
    print_table(
        con,
        f"{model}: F = W_V W_O per layer (seed 002); alignment = mean |cos(x, v1)| at the layer output",
        [
            Col("layer", justify="right"),
            "|λ1|",
            "λ1",
            "gap |λ2/λ1|",
            "align out",
            "random (95%)",
            "other layers",
            Col("v1 ≈ tokens", wrap=True),
        ],
        rows,
        short="F per layer",
    )
