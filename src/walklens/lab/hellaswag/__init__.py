"""The HellaSwag evaluation harness (seed 000, sec. 5): what the concept-space tests are measured against.

* :mod:`.data` — items preprocessed as lm-evaluation-harness does, few-shot examples and the pool rule;
* :mod:`.baseline` — lm-evaluation-harness's ``acc``/``acc_norm`` with the context computed once per item;
* :mod:`.store` — the SQLite result store (single runs, sweeps, per-cell counts) with resume and export.

Items are scored by the instrument's continuation scorer (:mod:`walklens.core.scoring`: requests, hidden states
and log-likelihoods, packed scoring).
"""

from __future__ import annotations

from .data import HellaswagItem, fewshot_examples, load_hellaswag, preprocess
from .store import ResultStore

__all__ = ["HellaswagItem", "ResultStore", "fewshot_examples", "load_hellaswag", "preprocess"]
