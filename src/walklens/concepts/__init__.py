"""Concept-space experiments on HellaSwag (seed 000, sec. 5 and A.6).

* :mod:`.data` — items preprocessed as lm-evaluation-harness does, few-shot examples;
* :mod:`.schemes` — the A.6 composition schemes (:class:`~.schemes.Scheme`);
* :mod:`.segment` — the encoding schemes (how a context is cut into examples and segments);
* :mod:`.compose` — word / segment / example aggregation, norms, similarities on batched tensors;
* :mod:`.encode` — hidden states of segment texts at any layer (one batched pass);
* :mod:`.vectors` — word-aggregated segment vectors, computed one way for Test 1, the sweep and compaction and
  kept in the concept cache (:mod:`walklens.concept_cache`);
* :mod:`.baseline` — lm-evaluation-harness's ``acc``/``acc_norm`` with the context computed once per item;
* :mod:`.test1` — pyramidal generation (sec. 5.1.1); :mod:`.test2` — concept similarity (sec. 5.1.2);
* :mod:`.store` — the SQLite result store with resume and CSV/Parquet export;
* :mod:`.runner` — runs over items with a progress bar, resume and normalised scores.
"""

from __future__ import annotations

from .data import HellaswagItem, fewshot_examples, load_hellaswag, preprocess
from .schemes import Scheme
from .store import ResultStore

__all__ = ["HellaswagItem", "ResultStore", "Scheme", "fewshot_examples", "load_hellaswag", "preprocess"]
