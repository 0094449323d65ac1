"""Models larger than memory (docs/scale.md): a model streamed layer by layer under a memory limit, measured.

    python benchmarks/bench_stream.py MODEL_DIR [--prompts 8] [--tokens 256] [--limit-gb 6] [--points PATTERNS]
                                      [--dtype bfloat16] [--json FILE] [--no-cgroup]

MODEL_DIR is a safetensors folder, e.g. a random-weight model of real shape written by
``python -m walklens.testing.shapes qwen3-14b DIR`` (random weights: memory, time and exactness, never what a trained
model does).  As root, the script moves itself into a new memory cgroup (v1 controller) limited to ``--limit-gb``
before loading anything, so the whole process (weights, activations, the page cache it fills) is held to the
limit; it reports the cgroup's peak, the process's peak RSS (VmHWM), the OOM events and the failures to charge.

One batch of ``--prompts`` texts of ``--tokens`` tokens (HellaSwag contexts, cut) runs through the streamed model in
one forward pass, keeping the points ``--points`` (float32 records).  Printed, from this one run:

- the bytes the stream read (its own count) against the checkpoint's bytes: one read of the weights per batch;
- the bytes read by the process (``/proc/self/io`` rchar: every read, page-cache hits too; read_bytes: from disk);
- the wall time of the pass against the time to read the layers' weights once (their share of every file read
  once, fresh, with the page cache dropped first when root) plus the same layers' compute measured in memory (layer
  0 held in memory, run on the same texts with its points captured to a trace folder as the pass captures them,
  times the number of layers): the ratio the issue bounds by 1.3 (and beside it the layer's bare forward).
  The pass also runs the embedding, the final norm and the head (read once at load, not streamed), which the
  ratio's denominator leaves out;
- the plan's estimates (``walklens.plan`` of the same batch, from the files alone, at this run's own rates: the
  fresh read rate above and the float32 matrix-product rate ``walklens calibrate`` times) against what the run
  measured: peak memory (the issue bounds it within 20%), bytes read, trace size and time (within a factor 1.5).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CGROUP = Path("/sys/fs/cgroup/memory")


def enter_cgroup(limit_gb: float) -> Path | None:
    """Move this process into a new memory cgroup limited to ``limit_gb`` (root only; removed at exit); None when
    it cannot."""
    if os.geteuid() != 0 or not CGROUP.is_dir():
        return None
    group = CGROUP / f"walklens-bench-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "memory.limit_in_bytes").write_text(str(int(limit_gb * 2**30)))
    try:
        (group / "memory.memsw.limit_in_bytes").write_text(str(int(limit_gb * 2**30)))
    except OSError:
        pass  # no swap accounting: the limit holds memory alone
    (group / "cgroup.procs").write_text(str(os.getpid()))
    atexit.register(_leave, group)
    return group


def _leave(group: Path) -> None:
    """Back to the root cgroup, and the benchmark's cgroup removed."""
    try:
        (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()
    except OSError:
        pass


def cgroup_report(group: Path | None) -> dict[str, Any]:
    if group is None:
        return {}
    read = lambda name: (group / name).read_text().strip()  # noqa: E731
    oom = dict(line.split() for line in read("memory.oom_control").splitlines())
    stat = dict(line.split() for line in read("memory.stat").splitlines())
    return {
        "cgroup_limit_gib": int(read("memory.limit_in_bytes")) / 2**30,
        "cgroup_peak_gib": int(read("memory.max_usage_in_bytes")) / 2**30,
        "cgroup_failcnt": int(read("memory.failcnt")),
        "cgroup_oom_kills": int(oom.get("oom_kill", 0)),
        "cgroup_peak_rss_like_gib": (int(stat.get("total_rss", 0)) + int(stat.get("total_mapped_file", 0))) / 2**30,
    }


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def read_once(folder: Path) -> tuple[float, int]:
    """Seconds to read every safetensors file of ``folder`` once (1 MiB reads), and the bytes read."""
    t0, n = time.perf_counter(), 0
    buf = bytearray(2**20)
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return time.perf_counter() - t0, n


def texts(n: int) -> list[str]:
    from walklens.lab.hellaswag.data import load_hellaswag

    items = load_hellaswag(limit=max(n * 4, 16))
    out, i = [], 0
    while len(out) < n:
        it = items[i % len(items)]
        out.append(" ".join([it.ctx, *it.endings] * 8))
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--limit-gb", type=float, default=6.0)
    ap.add_argument("--points", default="*", help="the points captured (glob patterns; default every point)")
    ap.add_argument("--trace-dir", default=None, help="the records written here as computed (default: a temp folder)")
    ap.add_argument("--walk-points", default="L*.resid_post", help="the points of the first text's encoding walk")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-cgroup", action="store_true")
    ap.add_argument("--warm", action="store_true", help="leave the weights in the page cache (read once first)")
    ap.add_argument("--in-memory", action="store_true", help="load every weight in memory (no stream): the reference")
    ap.add_argument(
        "--no-read-ahead", action="store_true", help="no read-ahead advice for the next layer (LayerStream.prefetch)"
    )
    ap.add_argument(
        "--compare", action="store_true", help="run in memory, then streamed (two processes), and compare: fits mode"
    )
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args)
    folder = Path(args.model)
    group = None if args.no_cgroup else enter_cgroup(args.limit_gb)
    dropped = drop_caches()
    t_read, file_bytes = read_once(folder)  # the weights read once, fresh (page cache dropped when root)
    if not args.warm:
        dropped = drop_caches() and dropped  # the pass reads from disk (a model larger than memory cannot be cached)

    import torch

    from walklens.core.capture import capture_batch
    from walklens.core.loading import load_model

    points = [p for p in args.points.split(",") if p]
    trace_dir = Path(args.trace_dir or tempfile.mkdtemp(prefix="walklens-bench-trace-"))
    planned = plan_of(folder, args, points, file_bytes / t_read, trace_dir.parent)
    rss0 = current_rss()
    io0, t0 = proc_io(), time.perf_counter()
    lm = load_model(str(folder), dtype=args.dtype, stream=not args.in_memory, progress=False)
    t_load = time.perf_counter() - t0
    if lm.stream is not None and args.no_read_ahead:
        lm.stream.prefetch = False
    seqs = [lm.tokenizer(t)["input_ids"][: args.tokens] for t in texts(args.prompts)]
    s1 = lm.stream.stats.bytes_read if lm.stream else 0
    io1 = proc_io()
    t1 = time.perf_counter()
    # every point of every text to disk as computed (float32 records); the head (after final) never runs
    batch = capture_batch(lm, seqs, points, to=trace_dir)
    t_pass = time.perf_counter() - t1
    io2 = proc_io()
    peak_pass = peak_rss_gib()
    kept = sum(p.stat().st_size for p in trace_dir.glob("*.safetensors"))
    t_walk, walk_points = walk_first(lm, trace_dir, args.walk_points) if args.walk_points else (0.0, 0)
    if lm.stream is None:
        out = {"mode": "in memory", "seconds_load": t_load, "seconds_pass": t_pass, "peak_rss_gib": peak_rss_gib()}
        return report(out, args.json)
    pass_read = lm.stream.stats.bytes_read - s1

    # the same layers' compute in memory: layer 0 held, run on the batch's hidden states (the pass's own input), bare
    # and with its points captured to disk as the pass captures them
    t_bare, t_layer = layer_compute(lm, seqs, points)
    compute, bare = t_layer * len(lm.stream.layers), t_bare * len(lm.stream.layers)
    layers_bytes = sum(lm.stream.file_bytes(p) for p in lm.stream.layers)
    t_read_layers = t_read * layers_bytes / file_bytes  # the layers' share of one read of every file
    out = {
        "cpu": cpu_name(),
        "model": str(folder),
        "dtype": args.dtype,
        "prompts": args.prompts,
        "tokens": args.tokens,
        "points": points,
        "layers": len(lm.stream.layers),
        "checkpoint_bytes": file_bytes,
        "resident_bytes_read_at_load": lm.stream.resident_file_bytes(),
        "layers_bytes": layers_bytes,
        "stream_bytes_read_per_pass": pass_read,
        "reads_of_the_layers_per_pass": pass_read / layers_bytes,
        "proc_rchar_pass": io2["rchar"] - io1["rchar"],
        "proc_read_bytes_pass": io2["read_bytes"] - io1["read_bytes"],
        "proc_rchar_load": io1["rchar"] - io0["rchar"],
        "page_cache_dropped": dropped,
        "seconds_load": t_load,
        "seconds_pass": t_pass,
        "seconds_read_weights_once": t_read,
        "seconds_read_layers_once": t_read_layers,
        "seconds_compute_in_memory": compute,
        "compute_in_memory_is": "layer 0 held in memory, its points captured to a trace folder as the pass does "
        "(the embedding before it), best of two, times the layers",
        "seconds_compute_in_memory_bare": bare,
        "ratio_pass_to_read_plus_compute": t_pass / (t_read_layers + compute),
        "ratio_pass_to_read_plus_bare_compute": t_pass / (t_read_layers + bare),
        "points_captured": len(batch.points),
        "trace_dir_bytes": kept,
        "seconds_walk_first_text": t_walk,
        "walk_points": walk_points,
        "peak_rss_gib": peak_rss_gib(),
        "rss_before_load_gib": rss0,
        **plan_check(planned, rss0, peak_pass, t_load + t_pass, io2["read_bytes"] - io0["read_bytes"], kept),
        **cgroup_report(group),
        "torch_threads": torch.get_num_threads(),
        "read_ahead": lm.stream.prefetch,
    }
    return report(out, args.json)


def report(out: dict[str, Any], path: str | None) -> int:
    text = json.dumps(out, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
    return 0


def compare(args: argparse.Namespace) -> int:
    """Fits mode: the same batch in memory, then streamed with the weights in the page cache (each in its own
    process, so each peak is its own); the records compared bit for bit, the time and peak memory as ratios."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="walklens-bench-compare-") as folder:  # two traces: gigabytes, removed
        return _compare_in(args, Path(folder))


def _compare_in(args: argparse.Namespace, tmp: Path) -> int:
    """:func:`compare` with its two trace folders under ``tmp``."""
    import subprocess

    from safetensors.torch import load_file

    common = [sys.executable, __file__, args.model, "--prompts", str(args.prompts), "--tokens", str(args.tokens)]
    common += ["--points", args.points, "--dtype", args.dtype, "--no-cgroup", "--warm", "--walk-points", ""]
    runs = {}
    for mode, extra in (("memory", ["--in-memory"]), ("stream", [])):
        out = tmp / f"{mode}.json"
        subprocess.run([*common, *extra, "--trace-dir", str(tmp / mode), "--json", str(out)], check=True)
        runs[mode] = json.loads(out.read_text())
    import torch

    shards = sorted(p.name for p in (tmp / "memory").glob("*.safetensors"))
    same = shards == sorted(p.name for p in (tmp / "stream").glob("*.safetensors")) and all(
        all(
            torch.equal(x, y)
            for x, y in zip(load_file(str(tmp / "memory" / n)).values(), load_file(str(tmp / "stream" / n)).values())
        )
        for n in shards
    )

    result = {
        "cpu": cpu_name(),
        "model": args.model,
        "bit_for_bit": same,
        "shards_compared": len(shards),
        "seconds_pass_in_memory": runs["memory"]["seconds_pass"],
        "seconds_pass_streamed": runs["stream"]["seconds_pass"],
        "ratio_streamed_to_in_memory": runs["stream"]["seconds_pass"] / runs["memory"]["seconds_pass"],
        "peak_rss_gib_in_memory": runs["memory"]["peak_rss_gib"],
        "peak_rss_gib_streamed": runs["stream"]["peak_rss_gib"],
        "peak_ratio_streamed_to_in_memory": runs["stream"]["peak_rss_gib"] / runs["memory"]["peak_rss_gib"],
    }
    return report(result, args.json)


def plan_of(folder: Path, args: argparse.Namespace, points: list[str], disk_rate: float, where: Path) -> Any:
    """The plan of this run's batch, from the files alone, at this run's rates: ``disk_rate`` (bytes per second,
    measured above), and the matrix-product rates (float32, bfloat16) and the write rate (to ``where``, the trace
    folder's disk) that ``walklens calibrate`` measures."""
    import torch

    from walklens.costs.calibration import DEFAULTS, Rates
    from walklens.costs.measure import matmul_rate, write_rate
    from walklens.costs.planning import plan

    rates = Rates(
        attn_element=DEFAULTS.attn_element,
        write_work=DEFAULTS.write_work,
        matmul_gflops=matmul_rate() / 1e9,
        bf16_gflops=matmul_rate(dtype=torch.bfloat16) / 1e9,
        disk_gbps=disk_rate / 1e9,
        write_gbps=write_rate(where),
    )
    return plan(
        str(folder),
        tokens=args.tokens,
        batch=args.prompts,
        dtype=args.dtype,
        stream=not args.in_memory,
        points=points,
        max_memory=args.limit_gb if not args.no_cgroup else None,
        rates=rates,
        to_disk=True,  # the run writes its trace folder as it computes
    )


def current_rss() -> float:
    """This process's resident memory now (GiB): Python's and torch's own, which a plan does not count."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def plan_check(p: Any, rss0: float, peak: float, seconds: float, read: int, trace: int) -> dict[str, Any]:
    """The plan's estimates beside the measurements: peak memory (the peak RSS of the load and the pass less the
    process's own before the load), time (the load and the pass), bytes read from disk and the trace's size."""
    measured_peak = (peak - rss0) * 2**30
    return {
        "plan": str(p),
        "plan_peak_bytes": p.peak,
        "measured_peak_bytes_beyond_the_process": measured_peak,
        "plan_peak_ratio_measured_to_planned": measured_peak / p.peak,
        "plan_seconds": p.seconds,
        "plan_seconds_ratio_measured_to_planned": seconds / p.seconds,
        "plan_read_bytes": p.read,
        "plan_read_ratio_measured_to_planned": read / p.read,
        "plan_trace_bytes": p.trace,
        "plan_trace_ratio_measured_to_planned": trace / p.trace if p.trace else None,
    }


def walk_first(lm: Any, folder: Path, points: str) -> tuple[float, int]:
    """Seconds of the first text's encoding walk at ``points``, read from the trace folder (no layer loaded)."""
    from walklens.analyses import encoding_walk
    from walklens.core.trace import Trace

    trace = Trace.open(folder, lm=lm, item=0)
    t0 = time.perf_counter()
    walk = encoding_walk(trace, lm=lm, points=points, progress=False)
    return time.perf_counter() - t0, len(walk.points)


def layer_compute(lm: Any, seqs: list[list[int]], points: list[str]) -> tuple[float, float]:
    """Seconds layer 0 takes in memory on the batch (held; its input captured first): bare (its forward alone), and
    as the pass runs it (the embedding, then layer 0 with its points captured to a fresh trace folder, stopping
    there), each the best of two."""
    import fnmatch
    import shutil

    import torch

    from walklens.core.capture import capture_batch, point_names

    x = capture_batch(lm, seqs, ["L0.resid_pre"], stop_early=True, dtype=None).hidden[0]
    path = next(iter(lm.stream.layers))
    layer = lm.stream.layers[path]
    names = point_names(lm.adapter.stack(), lm.adapter.residual_kind(lm.config), lm.n_layers)
    first = [n for n in names if n.startswith("L0.") and any(fnmatch.fnmatchcase(n, p) for p in points)]
    bare, captured = float("inf"), float("inf")
    with lm.stream.held(path), torch.no_grad():
        inner: Any = lm.model.model if hasattr(lm.model, "model") else lm.model
        T = x.shape[1]
        pos = torch.arange(T)[None].expand(x.shape[0], T)
        emb = inner.rotary_emb(x.to(lm.dtype), pos) if hasattr(inner, "rotary_emb") else None
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None].to(lm.dtype)
        for _ in range(2):
            t0 = time.perf_counter()
            layer(x.to(lm.dtype), attention_mask=mask, position_ids=pos, position_embeddings=emb)
            bare = min(bare, time.perf_counter() - t0)
        for _ in range(2):
            folder = Path(tempfile.mkdtemp(prefix="walklens-bench-layer0-"))
            t0 = time.perf_counter()
            capture_batch(lm, seqs, first, to=folder)
            captured = min(captured, time.perf_counter() - t0)
            shutil.rmtree(folder, ignore_errors=True)
    return bare, captured


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
