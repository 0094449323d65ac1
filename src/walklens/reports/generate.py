"""The decoding-walk report (``walklens generate``; seed 000, sec. 2.1, eqs. 10-15, the target path of A.1)
and its JSON document.  Both draw a :class:`~walklens.analyses.decoding.DecodingWalk`; nothing here runs a model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .html import Report, fields_of, pyplot, show

if TYPE_CHECKING:
    from ..analyses.decoding import DecodingWalk


def document(dw: DecodingWalk, model: str, *, vectors: bool = True) -> dict[str, Any]:
    """The ``--json`` document: every field of the walk and its generated text; the explorer's decoding view
    sends it too, with ``vectors=False``: without the decoding vectors ``d`` (steps x D numbers)."""
    return {"model": model, **fields_of(dw, () if vectors else ("d",)), "text": dw.text}


def _step_table(rep: Report, dw: DecodingWalk) -> None:
    """One row per step (eq. 10): the emitted token, its probability and rank, the target path or the greedy
    pick, |d_t| and its movement, the nearest tokens."""
    heads = [
        "step",
        "token",
        "P(token)",
        "rank",
        "in N(target)" if dw.target is not None else "greedy",
        "|d_t|",
        "step |Δd|",
        "angle°",
        "nearest tokens (P)",
    ]
    rows = []
    for i, tok in enumerate(dw.tokens):
        near = ", ".join(f"{show(s)} {float(p):.3f}" for s, p in zip(dw.top_tokens[i][:5], dw.top_probs[i][:5]))
        flag = (
            ("yes" if bool(dw.in_neighbourhood[i]) else "no")
            if dw.in_neighbourhood is not None
            else ("=" if int(dw.greedy_ids[i]) == int(dw.token_ids[i]) else show(dw.top_tokens[i][0]))
        )
        rows.append(
            [
                i,
                show(tok),
                float(dw.probs[i]),
                int(dw.ranks[i]),
                flag,
                float(dw.d_norm[i]),
                float(dw.step_length[i]),
                float(dw.step_angle[i]),
                near,
            ]
        )
    rep.table(heads, rows)


def _probability_figure(dw: DecodingWalk) -> Any:
    """Matplotlib bar chart: the probability of each emitted token (green where it is the nearest token)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(16, 3 + 0.45 * len(dw.tokens)), 3.2))
    ax.bar(range(len(dw.tokens)), dw.probs.numpy(), color=["#2ca02c" if int(r) == 0 else "#d62728" for r in dw.ranks])
    ax.set_xticks(range(len(dw.tokens)), [show(t) for t in dw.tokens], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("P(token)")
    ax.set_title("decoding walk: probability of each emitted token (green: the nearest token)", fontsize=10)
    fig.tight_layout()
    return fig


def build(dw: DecodingWalk, title: str, figures: bool = True) -> Report:
    """The ``walklens generate`` report of a decoding walk (eq. 10): the step table, probabilities, movement of
    d_t, the target path."""
    rep = Report(title, f"prompt: {dw.prompt!r}")
    mode = (
        "teacher-forced target"
        if dw.target is not None
        else f"sampled (seed {dw.seed}, temperature {dw.temperature}, top-k {dw.top_k}, top-p {dw.top_p})"
        if dw.sample
        else "greedy"
    )
    rep.h2("Decoding walk")
    rep.p(
        f"{mode}; {len(dw.tokens)} steps{'; stopped at end-of-sequence' if dw.stopped_at_eos else ''}. "
        f"Output: {dw.text!r}"
    )
    if dw.target is not None:
        where = (
            "the walk stays on the target path (every d_t has the target token as nearest token)"
            if dw.left_path_at < 0
            else f"the walk leaves the target path at step {dw.left_path_at} "
            f"(target {show(dw.tokens[dw.left_path_at])!r}, nearest {show(dw.top_tokens[dw.left_path_at][0])!r})"
        )
        rep.p(f"Target path (A.1): {where}.")
    _step_table(rep, dw)
    x = [f"{i}:{show(t)}" for i, t in enumerate(dw.tokens)]
    rep.lines(
        x,
        [
            {"name": "P(emitted token)", "y": dw.probs.tolist()},
            {"name": "P(nearest token)", "y": dw.top_probs[:, 0].tolist(), "dash": True},
        ],
        title="probability of each emitted token",
        xlabel="step: token",
        width=900,
    )
    rep.lines(
        x,
        [
            {"name": "step |d_t - d_t-1|", "y": dw.step_length.tolist()},
            {"name": "|d_t|", "y": dw.d_norm.tolist(), "dash": True},
        ],
        title="movement of the decoding vector d_t",
        xlabel="step: token",
        width=900,
    )
    if figures:
        rep.figure(_probability_figure(dw), "decoding_walk", embed=False)  # repeats the first line chart
    return rep


__all__ = ["build", "document"]
