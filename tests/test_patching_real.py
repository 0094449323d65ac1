"""Activation patching on the real default model (issue 55, slow): SmolLM2-135M's cells started at their layer from
the stored residual equal the plain single-patch forward passes bit for bit; a layer's cells in one batch equal them
within 1e-5 of the clean-corrupted gap (measured: 1.3e-6 over the full resid_pre grid,
docs/results/bench_patching.json)."""

from __future__ import annotations

import numpy as np
import pytest

from walklens.analyses.patching import patch

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"


@pytest.mark.slow
def test_smollm2_cells_are_single_patch_passes(smollm2) -> None:
    kw = dict(points=["L0.resid_pre", "L14.mlp_out", "L29.resid_pre", "L20.H3"], positions=[2, 8],
              metric='logitdiff:" Paris"," Rome"')  # fmt: skip
    single = patch(smollm2, CLEAN, CORRUPT, batch=1, incremental=False, **kw)
    incremental = patch(smollm2, CLEAN, CORRUPT, batch=1, **kw)
    batched = patch(smollm2, CLEAN, CORRUPT, **kw)
    assert np.array_equal(incremental.raw, single.raw)
    gap = abs(single.clean_metric - single.corrupted_metric)
    np.testing.assert_allclose(batched.raw, single.raw, rtol=0, atol=1e-5 * gap)
    assert single.cell("L29.resid_pre", 8) > 0.5  # the last layer's input at the last position carries most of it
