"""Attribution patching (issue 55): its first-order term equals a finite difference of the exact patched pass at every
point kind (a float64 model), its parity card's statistics, the warning where it disagrees, and the refusals where no
gradient exists."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from walklens.analyses.patching import attribute
from walklens.analyses.patching.attribution import ParityWarning, spearman, topk_overlap
from walklens.core.patching import Cell, Site, patched, record, run_logits
from walklens.testing import tiny_model

CLEAN = "the capital of france is paris"
CORRUPT = "the capital of england is london"


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[10] - logits[20]


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt_postnorm"])
def test_first_order_term_is_the_derivative_of_the_patched_pass(family: str) -> None:
    """For each kind, the central difference (m(base + t delta) - m(base - t delta)) / 2t at t = 1e-3 equals
    attribution's linear term (a float64 copy of the model; its norms still compute in float32, hence t and the
    tolerance)."""
    lm = tiny_model(family)
    lm.model.to(torch.float64)  # less rounding in the finite difference
    points = ["L1.resid_pre", "L0.attn_out", "L0.resid_mid", "L0.mlp_out", "L0.resid_post", "L0.H2"]
    r = attribute(lm, CLEAN, CORRUPT, points=points, positions=[3, 5], metric=_metric, parity=False)
    linear = r.raw - r.corrupted_metric
    ids = lm.tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    cids = lm.tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    sites = [Site(1, "resid_pre"), Site(0, "attn_out"), Site(0, "resid_mid"), Site(0, "mlp_out"), Site(0, "resid_post")]
    sites.append(Site(0, "head", 2))
    base, clean = record(lm, ids, sites, -1), record(lm, cids, sites, -1)
    d = lm.head_weights(0).d_head
    t = 1e-3
    for site in sites:
        i = r.points.index(site.name)  # the grid's rows are in layer order
        for j, p in enumerate([3, 5]):
            key = site.name if site.kind != "head" else "L0.heads"
            a, b = base.vectors[key][p], clean.vectors[key][p]
            if site.kind == "head":
                a, b = a[2 * d : 3 * d], b[2 * d : 3 * d]
            m = []
            for sign in (1, -1):
                with torch.no_grad(), patched(lm, [Cell(site, p, a + sign * t * (b - a))]):
                    m.append(float(_metric(run_logits(lm, ids, -1)[0])))
            fd = (m[0] - m[1]) / (2 * t)
            assert fd == pytest.approx(linear[i, j], rel=5e-3, abs=5e-4), (site.name, p)
            assert abs(fd) > 1e-3, (site.name, p)  # a cell that moves the metric: the check can fail


def test_rank_statistics() -> None:
    x = np.arange(10.0)
    assert spearman(x, x**3) == pytest.approx(1.0) and spearman(x, -x) == pytest.approx(-1.0)
    assert np.isnan(spearman(x, np.ones(10)))
    assert spearman(np.array([1.0, 2, 2, 3]), np.array([1.0, 2, 2, 3])) == pytest.approx(1.0)
    assert topk_overlap(np.array([5.0, -4, 0, 0, 1]), np.array([3.0, 0, -2, 0, 1]), 2) == 0.5


def test_parity_card_and_its_warning() -> None:
    """Every attribution result carries its card (over all cells and per kind); the warning and the note come exactly
    when it disagrees beyond the thresholds."""
    for family in ("llama", "gpt_neox"):
        lm = tiny_model(family)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = attribute(lm, CLEAN, CORRUPT, points=["resid_pre", "mlp_out"], metric="logitdiff:paris,london")
        card = r.parity
        assert card is not None and card.cells == 2 * lm.n_layers * 6 and set(card.by_kind) == {"resid_pre", "mlp_out"}
        warned = [w for w in caught if issubclass(w.category, ParityWarning)]
        assert bool(warned) == (not card.agrees) == bool(r.notes)
        assert r.document()["parity"]["agrees"] == card.agrees


def test_no_gradient_refused_in_one_line() -> None:
    lm = tiny_model("llama")
    with pytest.raises(Exception, match="no gradient through this model"):
        attribute(lm, CLEAN, CORRUPT, metric=lambda logits: logits.detach()[10] - logits.detach()[20])


def test_a_batched_recording_holds_each_run_in_its_own_row() -> None:
    """Attribution patching records both runs in one batched pass: each row's vectors, layer inputs and logits are its
    own run's (to the batch's rounding), and a pair of different lengths takes two passes."""
    from walklens.core.patching import record_rows

    lm = tiny_model("llama")
    sites = [Site(1, "resid_pre"), Site(0, "mlp_out"), Site(0, "head", 1)]
    ids = [lm.tokenizer(t, return_tensors="pt")["input_ids"] for t in (CLEAN, CORRUPT)]
    rows = record_rows(lm, torch.cat(ids), sites, -1, graph=True)
    for b, one in enumerate(record(lm, x, sites, -1) for x in ids):
        assert rows[b].row == b
        torch.testing.assert_close(rows[b].logits.detach(), one.logits, rtol=1e-5, atol=1e-5)
        for key, v in one.vectors.items():
            torch.testing.assert_close(rows[b].vectors[key].detach(), v, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rows[b].resid_pre[1].detach(), one.resid_pre[1], rtol=1e-5, atol=1e-5)
    assert attribute(lm, CLEAN, CORRUPT, points="L1.resid_pre", metric=_metric, parity=False).passes == 1
    short = attribute(
        lm,
        CLEAN,
        "the capital of england",
        points="L1.resid_pre",
        metric=_metric,
        parity=False,
        position_map={0: 0, 3: 3},
    )
    assert short.passes == 2 and np.isfinite(short.values).all()
