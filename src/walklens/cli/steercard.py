"""``walklens steer --card SET``: the steering card (seed 002): eigen-steering next to activation addition,
mean-difference steering and projection ablation on one dose scale, over a steering set's prompts, with
bootstrap intervals; generations kept in ``--store`` (SQLite) so a stopped card resumes, run in this process or,
with ``--backend ray``, on Ray actors holding the model once each (the options of the sweep commands)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from ..base.errors import InputError
from ..base.numbers import Range, numbers_list
from ..base.outputs import check_file
from ..base.records import Input
from ..lab.reports import steercard as card_report
from .backend import add_backend_args, backend_from_args
from .common import check_outputs, load, memory_budget, write_json
from .terminal import Col, console, print_table, say

METHODS = ("eigen", "add", "meandiff", "ablate")
#: the card's work limit when --max-work is not given: a card runs for an hour or more and resumes (TFLOP)
CARD_WORK_TFLOP = 100.0


def add_card_args(s: argparse.ArgumentParser) -> None:
    """The steering card's options of ``walklens steer``."""
    g = s.add_argument_group("steering card (--card)")
    g.add_argument(
        "--card",
        metavar="SET",
        default=None,
        help="run the steering card over a steering set: token, topic, sentiment, all (shipped) or a .jsonl file; "
        "--layers default to a quarter, half and three quarters of the depth",
    )
    g.add_argument(
        "--doses",
        default="0.25,0.5,1,2",
        help="comma-separated doses (change norm / mean residual norm), each > 0 and <= 100",
    )
    g.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {','.join(METHODS)}")
    g.add_argument(
        "--limit",
        type=Range(1, integer=True).arg(),
        default=None,
        metavar="N",
        help="only the first N prompts of each target in each split (default: all)",
    )
    g.add_argument("--store", metavar="FILE", default=None, help="SQLite file keeping the generations (resumable)")
    g.add_argument("--n-boot", type=Range(100, 100000, integer=True).arg(), default=1000, help="bootstrap resamples")
    g.add_argument("--seed", type=Range(0, 2**63 - 1, integer=True).arg(), default=0, help="bootstrap seed")
    g.add_argument(
        "--ppl-ratio",
        type=Range(1, open_lo=True, what="a number above 1 (finite)").arg(),
        default=2.0,
        help="coherence budget of the choice on 'choose': perplexity at most this times the unsteered one",
    )
    add_backend_args(g)  # where the card's units run: this process, or Ray actors (as the sweeps)


def refuse_backend(args: argparse.Namespace) -> None:
    """The backend options belong to the card (the other steer runs are one small sweep in this process)."""
    given = [f"--{k}" for k in ("backend", "address", "workers") if getattr(args, k, None) is not None]
    if given:
        raise InputError(f"{' and '.join(given)}: only the steering card (--card SET) takes the backend options")


def _methods(text: str) -> list[str]:
    got = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in got if m not in METHODS]
    if bad or not got:
        raise InputError(f"--methods: unknown method(s) {', '.join(bad) or '(none)'}; choose from {', '.join(METHODS)}")
    return got


def run_card(args: argparse.Namespace, layer_values: Any) -> int:
    """The steering card command (module docstring); ``layer_values(lm)`` gives the --layers as ints or None."""
    from ..lab.steeringcard import load_steering_set

    for bad, name in (
        (args.prompts, "PROMPT"),
        (args.toward, "--toward"),
        (args.export_control_vector, "--export-control-vector"),
    ):
        if bad:
            raise InputError(f"--card takes no {name}: the steering set gives the prompts and targets")
    from ..lab.steeringcard.card import DOSE

    sset = load_steering_set(args.card)  # a file is read as an input: no output may replace it
    doses = numbers_list(args.doses, DOSE, "--doses")
    methods = _methods(args.methods)
    backend = backend_from_args(args)  # local, or Ray actors; ray not installed is one line, before any work
    inputs = [] if _shipped(args.card) else [Input("--card", Path(args.card))]
    store = None
    if args.store:
        check_file(args.store, "--store")
        store = Path(args.store).expanduser()
        inputs.append(Input("--store", store))
    check_outputs(args, inputs=inputs)
    lm = (
        load(args)
        if backend.name == "local"
        else backend.driver_model(args.model, dtype=args.dtype, device=args.device)
    )
    layers = layer_values(lm) or sorted({lm.n_layers // 4, lm.n_layers // 2, (3 * lm.n_layers) // 4})
    _plan_card(lm, sset, (layers, doses, methods), args)
    with backend.workers(lm) as workers:
        card = _card(args, lm, sset, (layers, doses, methods), store, workers)
    _show(args, lm, card)
    return 0


def _shipped(name: str) -> bool:
    from ..lab.steeringcard import shipped_sets

    return name in shipped_sets() or name == "all"


def _plan_card(lm: Any, sset: Any, grid: tuple[list[int], list[float], list[str]], args: argparse.Namespace) -> None:
    """Refuse, before any work, a set this model cannot run, new tokens beyond the context, and a card over the
    limits (--max-work, default :data:`CARD_WORK_TFLOP`, and --max-memory): one line naming the largest
    --max-new-tokens that fits."""
    from ..costs import CardPlan, Limits, card_need, model_shape, tokens_that_fit
    from ..costs.planning import model_memory
    from ..lab.steeringcard.card import check_set
    from .limits import LimitError, check_context, text_tokens

    layers, doses, methods = grid
    n = args.max_new_tokens or 16
    prompts = [len(q) for ps in check_set(lm, sset, args.limit).values() for _, q in ps]
    check_context(lm, max(prompts), n, "--max-new-tokens")
    plan = CardPlan(
        prompts=tuple(prompts),
        neutral=tuple(text_tokens(lm, t, False) for t in sset.neutral),
        pairs=tuple(text_tokens(lm, x, False) for t in sset.targets.values() for p in t.pairs for x in p),
        cells=1 + len(set(layers)) * (len([m for m in methods if m != "ablate"]) * len(doses) + ("ablate" in methods)),
        targets=len(sset.targets),
        layers=len(set(layers)),
        eigen="eigen" in methods,
        meandiff=bool({"meandiff", "ablate"} & set(methods)),
    )
    limits = Limits(memory_budget(args), args.max_work or CARD_WORK_TFLOP, args.max_output, model_memory(lm))
    sh, files = model_shape(lm), {"json": bool(args.json), "out": bool(args.out)}
    over = card_need(sh, plan, steps=n, **files).over(limits)
    if over:
        k = tokens_that_fit(lambda s: card_need(sh, plan, steps=s, **files), limits, n)
        fit = f"at most {k} new tokens fit (--max-new-tokens)" if k else "no --max-new-tokens fits"
        raise LimitError(
            f"steering card of {plan.cells} cells over {len(prompts)} prompts of up to {max(prompts)} tokens, "
            f"{n} new tokens each, would need {' and '.join(over)}; {fit}, or give fewer --doses, --methods or "
            "--layers, a smaller --limit"
        )


def _card(
    args: argparse.Namespace,
    lm: Any,
    sset: Any,
    grid: tuple[list[int], list[float], list[str]],
    store: Any,
    workers: Any,
) -> Any:
    from ..lab.steeringcard import steering_card

    layers, doses, methods = grid
    return steering_card(
        lm,
        sset,
        layers=layers,
        doses=doses,
        methods=methods,
        max_new_tokens=args.max_new_tokens or 16,
        seed=args.seed,
        n_boot=args.n_boot,
        ppl_ratio=args.ppl_ratio,
        limit=args.limit,
        store=store,
        progress=sys.stderr.isatty(),
        workers=workers,
    )


def _show(args: argparse.Namespace, lm: Any, card: Any) -> None:
    """The choices as a table, then the JSON document and the report where asked."""
    con = console(args)
    rows = []
    for ch in card.choices:
        c = ch.heldout
        nums = (
            ["-"] * 4
            if c is None
            else [
                f"{c.effect.value:.3f} [{c.effect.lo:.3f}, {c.effect.hi:.3f}]",
                f"{c.wrong_way.value:.2f}",
                f"{c.log_ppl.value:.2f}",
                f"{c.kl.value:.3f}",
            ]
        )
        dose = "(no dose)" if ch.dose != ch.dose else f"dose {ch.dose:g}"  # ablation has none (NaN)
        where = "-" if ch.layer is None else f"L{ch.layer} {dose}"
        rows.append([ch.kind, ch.method, where, *nums])
    print_table(
        con,
        f"{lm.name}: steering card on {card.set_name} (chosen on 'choose', reported on 'heldout')",
        ["kind", "method", "chosen", Col("effect [95%]", justify="right"), "wrong way", "log ppl", "KL neutral"],
        [[escape(str(v)) for v in r] for r in rows],
        keys=2,
        short="steering card",
    )
    say(con, f"units generated {card.units_generated}, read from the store {card.units_stored}")
    if args.json:
        write_json(args.json, card_report.document(card))
    if args.out:
        say(con, f"report: {card_report.build(card).save(args.out)}")


__all__ = ["add_card_args", "refuse_backend", "run_card", "CARD_WORK_TFLOP", "METHODS"]
