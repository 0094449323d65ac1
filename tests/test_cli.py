"""Command line: one-line errors, exit code 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _toy import write_items


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "walklens", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,msg",
    [
        (("walk", "hi", "--model", "nope"), "unknown model"),
        (("walk", "", "--model", "smollm2-135m"), "empty"),
        (("walk", "@/no/such/file"), "no such file"),
        (("nosuchcommand",), "invalid choice"),
    ],
)
def test_bad_input_one_line_exit_2(args, msg):
    r = run(*args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("walklens:")]
    assert len(lines) == 1 and msg in lines[0]


@pytest.mark.real
def test_walk_json(tmp_path, smollm2):
    out = tmp_path / "w.json"
    r = run("walk", "The capital of France is", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["tokens"][-1] == " is"


def test_an_error_message_with_a_newline_stays_one_line(tmp_path, capsys):
    """A path holding a newline (or a library message over several lines) is still one stderr line."""
    from walklens.cli import main

    bad = tmp_path / "two\nlines.txt"
    rc = main(["walk", f"@{bad}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("walklens: error: "), err


# ---- --json -, the order of the checks, --seed ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama saved as a model directory, a four-item HellaSwag file and a database of one sweep."""
    from walklens.cli import main
    from walklens.testing import tiny_model

    root = tmp_path_factory.mktemp("cli")
    lm = tiny_model("llama")
    lm.model.save_pretrained(root / "model")
    lm.tokenizer.save_pretrained(root / "model")
    data = write_items(
        root / "items.jsonl",
        [
            (f"the {w} ran to the", "", ["river.", "city.", "house.", "dog."], i % 4)
            for i, w in enumerate(("king", "dog", "man", "cat"))
        ],
    )
    db = root / "r.sqlite"
    assert (
        main(
            [
                "sweep",
                "--test",
                "2",
                "--grid",
                "standard",
                "--layers",
                "E,-1",
                "--model",
                str(root / "model"),
                "--data",
                str(data),
                "--db",
                str(db),
                "--no-progress",
            ]
        )
        == 0
    )
    return {"model": str(root / "model"), "data": str(data), "db": str(db), "root": root}


JSON_COMMANDS = {
    "walk": ["walk", "the cat and the dog"],
    "generate": ["generate", "the cat and the", "--max-new-tokens", "2"],
    "simmap": ["simmap", "the cat and the dog"],
    "heads": ["heads", "the cat and the dog"],
    "kernels": ["kernels", "--samples", "2", "--length", "12"],
    "power": ["power", "the cat and the dog", "--no-dynamics", "--no-shared"],
    "steer": [
        "steer",
        "the cat and the",
        "--toward",
        " dog",
        "--layers",
        "0",
        "--alpha",
        "0,4",
        "--max-new-tokens",
        "2",
    ],
    "baseline": ["hellaswag", "baseline", "--no-db", "--no-progress"],
    "test2": ["hellaswag", "test2", "--no-db", "--no-progress"],
    "sweep": ["sweep", "--test", "2", "--grid", "standard", "--no-progress"],
}


@pytest.mark.parametrize("command", list(JSON_COMMANDS))
def test_json_to_stdout_is_all_stdout_holds(tiny, capsys, command):
    """``--json -``: standard output is exactly one JSON document (it used to be followed by the tables, which
    now go to standard error)."""
    from walklens.cli import main

    argv = [*JSON_COMMANDS[command], "--model", tiny["model"], "--json", "-"]
    if command in ("baseline", "test2", "sweep"):
        argv += ["--data", tiny["data"]]
    if command == "sweep":
        argv += ["--db", str(tiny["root"] / f"json_{command}.sqlite")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.endswith("\n") and out.count("\n") == 1
    assert isinstance(json.loads(out), dict)
    assert "┃" in err or "grid standard" in err  # the tables (the sweep's lines) are still shown, on stderr


def test_sweep_checks_data_and_database_before_loading_the_model(tiny, tmp_path, capsys, monkeypatch):
    """A bad data file or database is refused in one line before the model loads (it used to be loaded
    first, so an unusable --model hid the real error, and a good one cost its loading time)."""
    import walklens.cli.common as common
    from walklens.cli import main

    monkeypatch.setattr(common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setenv("WALKLENS_DB", str(tmp_path / "default.sqlite"))  # never the user's own database
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n", encoding="utf-8")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 300)
    for cmd in (
        ["sweep", "--test", "2", "--grid", "standard"],
        ["hellaswag", "sweep", "--test", "1"],
        ["hellaswag", "baseline"],
    ):
        for extra, where in (
            (["--data", str(bad), "--db", str(tmp_path / "new.sqlite")], bad),
            (["--data", tiny["data"], "--db", str(junk)], junk),
            (["--data", str(tmp_path / "missing.jsonl")], tmp_path / "missing.jsonl"),
        ):
            assert main([*cmd, *extra, "--model", str(tmp_path / "no-such-model")]) == 2, (cmd, extra)
            lines = capsys.readouterr().err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("walklens: error: ") and str(where) in lines[0], lines
    assert not (tmp_path / "new.sqlite").exists()  # nothing was created on the way


@pytest.mark.parametrize(
    "cmd",
    [
        ["sweep", "--test", "2", "--grid", "standard", "--dry-run"],
        ["hellaswag", "sweep", "--test", "2", "--dry-run"],
        ["hellaswag", "baseline", "--no-db"],
        ["hellaswag", "test1", "--no-db"],
    ],
)
@pytest.mark.parametrize("seed", ["-1", "18446744073709551616", "x"])
def test_hellaswag_seed_is_checked_in_one_line(tiny, capsys, cmd, seed):
    """--seed of the HellaSwag commands goes through seed_arg (a plain int took -1 and 2**64, which failed
    later, deep in the few-shot sampler or numpy)."""
    from walklens.cli import main

    with pytest.raises(SystemExit) as e:
        main([*cmd, "--model", tiny["model"], "--data", tiny["data"], f"--seed={seed}"])
    lines = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and len(lines) == 1
    assert lines[0].startswith("walklens: error: argument --seed: a seed must be an integer from 0 to 2**63-1")


def test_hellaswag_options_are_declared_once():
    """baseline, test1, test2 and sweep share one declaration of the HellaSwag options (same help, types and
    defaults)."""
    from walklens.cli import build_parser

    def options(*path):
        p = build_parser()
        for name in path:
            p = next(a for a in p._actions if a.dest in ("command", "hellaswag_command")).choices[name]
        return {
            a.dest: (a.help, a.type, a.default)
            for a in p._actions
            if a.dest in ("model", "dtype", "device", "data", "limit", "shots", "seed", "db", "no_progress")
        }

    ref = options("hellaswag", "baseline")
    assert len(ref) == 9
    for path in (("hellaswag", "test1"), ("hellaswag", "test2"), ("hellaswag", "sweep"), ("sweep",)):
        assert options(*path) == ref, path
