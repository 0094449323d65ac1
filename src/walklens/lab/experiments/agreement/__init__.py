"""Agreement of one model's HellaSwag results in two dtypes (docs/dtype.md, "Agreement study").

The same items run in a reference dtype (float32, which equals lm-evaluation-harness) and in another one
(bfloat16) are read back from one results database, keyed by the model's name (``smollm2-135m`` and
``smollm2-135m@bfloat16``, :func:`walklens.base.precision.model_label`), and compared:

* a single run (the baseline, a Test 1 or Test 2 scheme; :class:`RunAgreement`): per metric the share of items
  whose pick is the same (Wilson 95% interval), the difference of the accuracies with a 95% interval for a
  *paired* difference (:func:`paired_difference`: Newcombe 1998, method 10) and McNemar's exact test, and the
  distribution of the per-ending score differences (log-likelihoods for the baseline and Test 1);
* a sweep (Test 2's full grid, a Test 1 grid; :class:`GridAgreement`): per metric the share of schemes whose
  accuracy moves, the largest move, the share of identical picks, whether the best k schemes are the same
  set (k = 1, 5, 20), the rank correlation of the schemes' accuracies (Spearman's rho and Kendall's tau-b,
  scipy) and the reference's best schemes (default 20) with their accuracy, rank and difference in both.
  Sweeps store 2-bit picks only, so grids have no score differences.  Test 1's ``enc=cross_encoding`` scheme
  (the baseline itself) is left out of the schemes, as in the report.

Both stores are opened read-only; a run missing in either dtype is one :class:`~walklens.base.errors.InputError`
line naming it and the command that produces it.

The package's modules: :mod:`~walklens.lab.experiments.agreement.paired` (:func:`paired_difference`),
:mod:`~walklens.lab.experiments.agreement.runs` (single runs), :mod:`~walklens.lab.experiments.agreement.sweeps`
(sweeps) and :mod:`~walklens.lab.experiments.agreement.study` (:func:`agreement_study`).
"""

from __future__ import annotations

from .paired import PairedDifference, paired_difference
from .runs import PickAgreement, RunAgreement, ScoreDifferences, compare_runs, pick_agreement, score_differences
from .study import PARTS, AgreementStudy, agreement_study
from .sweeps import TOP_KS, GridAgreement, GridMetricAgreement, Ranking, SchemeMove, Scope, TopK, compare_sweeps

__all__ = [
    "PARTS",
    "TOP_KS",
    "AgreementStudy",
    "GridAgreement",
    "GridMetricAgreement",
    "PairedDifference",
    "PickAgreement",
    "Ranking",
    "RunAgreement",
    "SchemeMove",
    "Scope",
    "ScoreDifferences",
    "TopK",
    "agreement_study",
    "compare_runs",
    "compare_sweeps",
    "paired_difference",
    "pick_agreement",
    "score_differences",
]
