"""A streamed capture to a trace folder killed with SIGKILL (another process, ``walklens walk --stream --trace-dir``):
mid-layer (the layer's weights read, its attention done), mid-shard (half a shard in its temp file) and between a
shard's rename and the manifest's update.  What the kill leaves is never taken as complete: the manifest lists only
whole shards, another command on the folder is one line with the folder untouched, and the rerun resumes to the
very files of an uninterrupted capture.  Also: a streamed model whose tensors disagree with its config is refused
in one line before any work (nothing written, no layer read)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import walklens
from _cli import run as run_cli
from _toy import saved_tiny
from walklens.base.errors import InputError
from walklens.core.loading import load_model

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the capital of france is paris and the king ran to the river"

#: the child: ``walklens ARGV``, SIGKILLed by itself where ``KILL_MODE`` says (deterministic, no polling)
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from walklens.cli import main
    from walklens.core import tracewrite
    mode, at, mark = os.environ["KILL_MODE"], int(os.environ["KILL_AT"]), os.environ["KILL_MARK"]
    seen = [0]

    def die(note):
        with open(mark, "w") as f:
            f.write(note)
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == "mid-layer":  # in layer AT's feed-forward block: its weights read, its attention done
        def pre(module, args):
            if type(module).__name__.endswith("MLP"):
                seen[0] += 1
                if seen[0] == at + 1:
                    die(str(next(module.parameters()).device))
        torch.nn.modules.module.register_module_forward_pre_hook(pre)
    elif mode == "mid-shard":  # shard AT half written to its temp file
        real = tracewrite.sha256_file
        def hashed(path, *a, **k):
            seen[0] += 1
            if seen[0] == at + 1:
                size = os.path.getsize(path)
                os.truncate(path, size // 2)
                die(os.path.basename(path))
            return real(path, *a, **k)
        tracewrite.sha256_file = hashed
    else:  # "unlisted": shard AT renamed onto its name, the manifest not yet updated
        real_save = tracewrite.TraceWriter.save_manifest
        def save(self):
            if len(self.manifest["shards"]) == at + 1:
                die(self.manifest["shards"][max(self.manifest["shards"], key=self.order.get)]["file"])
            real_save(self)
        tracewrite.TraceWriter.save_manifest = save
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_tiny("llama", "float32", tmp_path_factory.mktemp("m"))


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ".lock"}


def walk_args(model: Path, to: Path, text: str = TEXT) -> list[str]:
    return ["walk", text, "--model", str(model), "--stream", "--norm", "none", "--k", "2", "--trace-dir", str(to)]


@pytest.mark.parametrize("mode", ["mid-layer", "mid-shard", "unlisted"])
def test_a_capture_killed_mid_layer_resumes_to_the_uninterrupted_files(model, mode, tmp_path, capfd) -> None:
    straight = tmp_path / "straight"
    assert run_cli(capfd, *walk_args(model, straight))[0] == 0
    half, mark = tmp_path / "half", tmp_path / "mark"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src"), "KILL_MODE": mode,
           "KILL_AT": "1" if mode == "mid-layer" else "7", "KILL_MARK": str(mark)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", CHILD, *walk_args(model, half)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    manifest = json.loads((half / "manifest.json").read_text())
    listed = {e["file"] for e in manifest["shards"].values()}
    whole = files(straight)
    assert not manifest["complete"] and 0 < len(listed) < len(whole) - 1
    assert all(files(half)[f] == whole[f] for f in listed)  # every listed shard is whole
    left = set(files(half)) - listed - {"manifest.json"}
    note = mark.read_text()
    if mode == "mid-layer":
        assert note == "cpu" and left == set()  # killed with layer 1's weights in memory
        points = {f.split("-", 1)[1].removesuffix(".safetensors") for f in listed}
        assert {"L1.attn_out", "L1.resid_mid"} <= points and not points & {"L1.mlp_out", "L1.resid_post"}
    elif mode == "mid-shard":
        (tmp,) = left
        assert tmp == note and tmp.startswith(".") and tmp.endswith(".tmp")  # half a shard, never under its name
    else:
        assert left == {note} and files(half)[note] == whole[note]  # whole, but not listed: written again
    with pytest.raises(InputError, match=rf"an interrupted capture \({len(listed)} of"):
        walklens.Trace.open(half)
    before = files(half)
    rc, err = run_cli(capfd, *walk_args(model, half, "other words"))
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"walklens: error: --trace-dir {half}: holds a trace of")
    assert files(half) == before  # refused untouched
    rc, err = run_cli(capfd, *walk_args(model, half))  # the same command resumes
    assert rc == 0, err
    assert files(half) == whole  # shard for shard, byte for byte; no temp file left
    lm = load_model(str(model), progress=False, stream=True)
    assert torch.equal(walklens.Trace.open(half, lm).hidden, walklens.capture(lm, TEXT).hidden)


# ---- a checkpoint that disagrees with its config, refused before any work ------------------------------------------


def _rewrite(folder: Path, change: str) -> None:
    path = folder / "model.safetensors"
    sd = load_file(str(path))
    if change == "shape":  # layer 1's value projection one column short
        k = next(k for k in sorted(sd) if k.endswith("layers.1.self_attn.v_proj.weight"))
        sd[k] = sd[k][:, :-1].contiguous()
    elif change == "extra":  # a tensor no parameter of the config's model takes
        sd["model.layers.1.mlp.extra.weight"] = torch.zeros(3, 3)
    else:  # "expert": one expert of layer 1 of another width (the fused experts cannot be built)
        k = next(k for k in sorted(sd) if ".layers.1." in k and "experts.3.up_proj" in k)
        sd[k] = sd[k][:-1].contiguous()
    save_file(sd, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("family", "change", "says"),
    [
        ("llama", "shape", r"tensor for 'model.layers.1.self_attn.v_proj.weight' has shape \[16, 31\], "
         r"the config makes it \[16, 32\]"),
        ("llama", "extra", "the checkpoint's tensor 'model.layers.1.mlp.extra.weight' fits no parameter"),
        ("qwen3_moe", "expert", "the checkpoint's tensors for 'model.layers.1.mlp.experts.gate_up_proj' do not fit"),
    ],
)  # fmt: skip
def test_tensors_that_disagree_with_the_config_are_refused_before_any_work(family, change, says, tmp_path, capfd):
    folder = saved_tiny(family, "float32", tmp_path)
    _rewrite(folder, change)
    to = tmp_path / "t"
    rc, err = run_cli(capfd, "walk", TEXT, "--model", str(folder), "--stream", "--trace-dir", str(to))
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"walklens: error: {folder}: "), err
    assert re.search(says, err[0]), err
    assert not to.exists() or files(to) == {}  # no shard, no manifest


def test_a_config_with_more_layers_than_the_shards_hold_is_refused(tmp_path, capfd) -> None:
    folder = saved_tiny("llama", "float32", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    n = config["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": n + 1}))
    to = tmp_path / "t"
    rc, err = run_cli(capfd, "walk", TEXT, "--model", str(folder), "--stream", "--trace-dir", str(to))
    assert rc == 2 and err == [
        f"walklens: error: {folder}: config.json gives num_hidden_layers {n + 1}, but the weights hold {n} layers "
        f"(model.layers.0 to model.layers.{n - 1})"
    ]
    assert not to.exists() or files(to) == {}
