"""The one rule for inputs and outputs, walked over every command of the CLI: for each command, each input it
reads and each output it writes, an output that is the input, a symbolic link to it or a hard link to it (or, for
a folder input, a path inside it) is refused in one line before any model loads, and the input stays as it was.

The commands, their inputs and their outputs are read from the parser itself, so a new command or a new path
option is walked as soon as it exists; a path option this file does not know fails the coverage test."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from _toy import ROWS, write_items
from walklens.cli import build_parser, main

#: Option dests that name something a command reads, and how to make a valid-looking one in a folder.
INPUTS: dict[str, Callable[[Path], Path]] = {}
#: Option dests that name a file (or a folder: ``DIR_OUTPUTS``) a command writes.
OUTPUTS = {"json", "out", "write", "export_control_vector", "blocks", "trace_dir"}
DIR_OUTPUTS = {"out", "trace_dir"}
#: Dests that hold a text or @FILE (an input only as @FILE).
TEXTS = {"text", "prompt", "prompts", "texts", "target"}
#: Path-like dests that are neither: `--address` is a Ray address, `--scheme` a name, `--host` an address.
NOT_PATHS = {"address", "scheme", "host", "example", "method", "what", "metric", "points", "point", "table", "split"}


def _input(dest: str) -> Callable[[Callable[[Path], Path]], Callable[[Path], Path]]:
    def register(make: Callable[[Path], Path]) -> Callable[[Path], Path]:
        INPUTS[dest] = make
        return make

    return register


@_input("model")
def _model(tmp: Path) -> Path:
    folder = tmp / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return folder


@_input("data")
def _data(tmp: Path) -> Path:
    return write_items(tmp / "items.jsonl", ROWS)


@_input("db")
def _db(tmp: Path) -> Path:
    from walklens.lab.hellaswag.store import ResultStore

    ResultStore(tmp / "results.sqlite").close()
    return tmp / "results.sqlite"


@_input("grid")
def _grid(tmp: Path) -> Path:
    (tmp / "grid.toml").write_text('layers = ["-1"]\n')
    return tmp / "grid.toml"


@_input("summary")
def _summary(tmp: Path) -> Path:
    (tmp / "summary.json").write_text('{"runs": []}')
    return tmp / "summary.json"


@_input("corpus")
def _corpus(tmp: Path) -> Path:
    (tmp / "corpus.txt").write_text("one line of text\nanother line\n")
    return tmp / "corpus.txt"


@_input("card")
def _card(tmp: Path) -> Path:
    from walklens.lab.steeringcard.sets import shipped_sets

    assert "token" in shipped_sets()
    source = Path(__import__("walklens").__file__).parent / "lab" / "data" / "steering" / "token.jsonl"
    (tmp / "set.jsonl").write_bytes(source.read_bytes())
    return tmp / "set.jsonl"


@_input("store")
def _store(tmp: Path) -> Path:
    from walklens.lab.steeringcard.store import CardStore

    CardStore(tmp / "store.sqlite").close()
    return tmp / "store.sqlite"


@_input("cache")
def _cache(tmp: Path) -> Path:
    from walklens.analyses.concepts.cache import ConceptCache

    ConceptCache(tmp / "cache").close()
    return tmp / "cache"


@_input("file")
def _experiment(tmp: Path) -> Path:
    db, data = _db(tmp), _data(tmp)
    (tmp / "exp.toml").write_text(f'models = ["tiny"]\ntests = [2]\ngrid = "standard"\ndb = "{db}"\ndata = "{data}"\n')
    return tmp / "exp.toml"


@_input("root")
def _root(tmp: Path) -> Path:
    """The committed results under ``--root`` (``reproduce --render --out docs`` writes beside them, not in them)."""
    (tmp / "root" / "docs" / "results").mkdir(parents=True)
    return tmp / "root" / "docs" / "results"


@_input("vector")
def _vector(tmp: Path) -> Path:
    import numpy as np

    np.save(tmp / "v.npy", np.ones(8, dtype=np.float32))
    return tmp / "v.npy"


@_input("disk")
def _disk(tmp: Path) -> Path:
    (tmp / "m").mkdir()
    (tmp / "m" / "model.safetensors").write_bytes(b"\0" * 64)
    return tmp / "m"


@_input("patch")
def _patch(tmp: Path) -> Path:
    (tmp / "grid.json").write_text("{}")
    return tmp / "grid.json"


@_input("$WALKLENS_CACHE")
def _walklens_cache(tmp: Path) -> Path:
    """walklens' own cache (derived adapters, de-quantised GGUF): an input of every command."""
    (tmp / "derived").mkdir()
    (tmp / "derived" / "entry.json").write_text("{}")
    return tmp


@_input("@FILE")
def _text_file(tmp: Path) -> Path:
    (tmp / "text.txt").write_text("The capital of France is")
    return tmp / "text.txt"


#: How the rule refuses: an output that is an input, or a folder output named by a file.
REFUSALS = ("an output may never replace an input", "is not a directory")


def leaves() -> dict[str, argparse.ArgumentParser]:
    """Every command of the CLI by its words (``hellaswag test2``), read from the parser."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[" ".join(words)] = parser
        for a in subs:
            for name, sp in a.choices.items():
                walk(sp, [*words, name])

    walk(build_parser(), [])
    return found


def _dests(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest != "help"}


#: What a command needs besides the input under test to reach its output check (``{x}``: an input made by INPUTS).
BASE: dict[str, list[str]] = {
    "compact": ["some text to compact"],
    "generate": ["a prompt"],
    "heads": ["a text"],
    "simmap": ["a text"],
    "walk": ["a text"],
    "export": ["a text"],
    "patch": ["the cat sat", "the dog sat"],
    "power": ["a text"],
    "steer": ["a prompt", "--toward", " Paris", "--layers", "3"],
    "sweep": ["--test", "2"],
    "hellaswag sweep": ["--test", "2"],
    "experiment run": ["{file}"],
    "hellaswag export": ["{out}"],
    "verify": ["{model}"],
    "adapter": ["{model}", "--write", "{out}"],
    "reproduce": ["--render", "--root", "{root}", "--out", "{outdir}"],
    "hellaswag compaction": ["--out", "{outdir}"],
    "report": ["--db", "{db}"],
    "hellaswag folds": ["--test", "2", "--summary", "{summary}"],
    "hellaswag selection": ["--test", "2", "--summary", "{summary}"],
    "hellaswag pools": ["--shots", "1"],
}
#: Inputs a command takes only together with other options (in place of BASE).
WITH = {("steer", "card"): ["--card", "{card}"], ("steer", "store"): ["--card", "{card}", "--store", "{store}"]}


def cases() -> list[tuple[str, str, str, str]]:
    """(command, input, output option, how the output names the input) for every command that writes."""
    out = []
    for words, parser in leaves().items():
        dests = _dests(parser)
        outs = sorted(d for d in dests if d in OUTPUTS)
        ins = sorted(d for d in dests if d in INPUTS)
        if any(d in TEXTS and not dests[d].option_strings for d in dests) or "target" in dests:
            ins.append("@FILE")
        ins.append("$WALKLENS_CACHE")
        for i in ins:
            for o in outs:
                if (words, i) in WITH and o == "export_control_vector":
                    continue  # a card exports no control vector
                for how in ("same", "symlink", "hardlink"):
                    if INPUTS[i].__name__ in ("_model", "_cache", "_root", "_walklens_cache") and how == "hardlink":
                        continue  # folders have no hard links: "same" and "symlink" name a file inside
                    out.append((words, i, o, how))
    return out


def test_every_path_option_is_known() -> None:
    """A path option this file does not know (a new input or output) fails here until it is walked."""
    unknown = []
    for words, parser in leaves().items():
        for a in parser._actions:
            if a.metavar in ("FILE", "DIR", "PATH", "SET") or (a.dest in TEXTS):
                if a.dest not in INPUTS and a.dest not in OUTPUTS and a.dest not in TEXTS | NOT_PATHS:
                    unknown.append(f"{words} {a.dest}")
    assert unknown == []


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": path.read_bytes()}


@pytest.mark.parametrize("words,inp,opt,how", cases(), ids=lambda v: str(v).replace(" ", "-"))
def test_no_output_replaces_an_input(words, inp, opt, how, tmp_path, monkeypatch, no_model, capsys) -> None:
    monkeypatch.setenv("WALKLENS_DB", str(tmp_path / "default.sqlite"))
    made = {}
    for k, make in INPUTS.items():
        (tmp_path / k.strip("@$")).mkdir()
        made[k] = make(tmp_path / k.strip("@$"))
    monkeypatch.setenv("WALKLENS_CACHE", str(made["$WALKLENS_CACHE"]))
    target = made[inp]
    if how == "same":
        named = target / "x.json" if target.is_dir() else target
    elif how == "symlink":
        named = tmp_path / "link"
        named.symlink_to(target)
        named = named / "x.json" if target.is_dir() else named
    else:
        named = tmp_path / "hard"
        os.link(target, named)
    before = _snapshot(target)
    subst = (
        {k.strip("@$"): str(v) for k, v in made.items()}
        | {"root": str(made["root"].parent.parent)}
        | {
            "out": str(tmp_path / "o.csv"),
            "outdir": str(tmp_path / "outdir"),
        }
    )
    argv = [*words.split(), *(a.format(**subst) for a in WITH.get((words, inp), BASE.get(words, [])))]
    if inp == "@FILE":
        argv = [f"@{target}" if a in BASE.get(words, [""])[:1] else a for a in argv]
        if "target" in _dests(leaves()[words]) and words == "generate":
            argv += ["--target", f"@{target}"]
    elif inp != "$WALKLENS_CACHE" and (words, inp) not in WITH and f"--{inp}" not in argv and str(target) not in argv:
        argv += [f"--{inp}", str(target)]
    flag = {"out": "--out", "json": "--json", "write": "--write", "blocks": "--blocks"}.get(
        opt, f"--{opt.replace('_', '-')}"
    )
    if words == "hellaswag export" and opt == "out":
        argv[2] = str(named)
    elif words == "adapter" and opt == "write":
        argv[argv.index("--write") + 1] = str(named)
    elif words == "reproduce" and opt == "out":
        argv[argv.index("--out") + 1] = str(named)
    else:
        argv += [flag, str(named)]
    if opt == "export_control_vector" and (words, inp) not in WITH:
        argv += ["--method", "add", "--add-alpha", "1"]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and not no_model, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("walklens: error: "), err
    assert any(w in lines[0] for w in REFUSALS), (argv, err)  # refused by the rule, not by a missing option
    assert _snapshot(target) == before
