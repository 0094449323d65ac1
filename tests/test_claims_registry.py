"""The claims registry as data: src/walklens/lab/claims/claims.toml, checked on load (a planted fault is one line naming
the claim and the key), shipped in the package, and the one source of docs/claims.md's table (a number edited in
it, or in a timings file it names, is a number edited in the render)."""

from __future__ import annotations

import fnmatch
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from walklens.base.errors import InputError
from walklens.lab.claims import CLAIMS, load, render
from walklens.lab.claims.registry import DATA
from walklens.lab.claims.timings import TIME, cost, why

ROOT = Path(__file__).resolve().parents[1]
T1_TIMINGS = "docs/results/test1_fullset/timings.txt"


def _planted(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    """A copy of the registry with the first ``count`` occurrences of ``old`` replaced by ``new``."""
    text = DATA.read_text(encoding="utf-8")
    assert text.count(old) >= count, old  # the fault is planted where it is meant to be
    p = tmp_path / "claims.toml"
    p.write_text(text.replace(old, new, count), encoding="utf-8")
    return p


def _row(table: str, claim: str) -> str:
    return next(ln for ln in table.splitlines() if ln.startswith(f"| {claim} |"))


def test_the_registry_is_its_data_file_shipped_in_the_package() -> None:
    assert load(DATA) == CLAIMS and len(CLAIMS) == len({c.id for c in CLAIMS}) >= 40
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = data["tool"]["setuptools"]["package-data"]["walklens"]
    assert any(fnmatch.fnmatch(DATA.relative_to(ROOT / "src/walklens").as_posix(), p) for p in patterns), patterns


# the first table of the file is T2-best-full (reader heldout, rule seed_figure, target 0.826, no cost); the first with
# a cost is T1-best-full-set
FIRST = '[[claim]]\nid = "T2-best-full"\n'
COSTED = f'cost = {{ timings = "{T1_TIMINGS}", entry = "Test 1 on all 10,042 items", line = "total" }}\n'
FAULTS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ('rule = "seed_figure"', 'rule = "reach"', "unknown rule", ("T2-best-full", "field 'rule'", "below_baseline")),
    ('reader = "heldout"', 'reader = "held_out"', "unknown reader", ("T2-best-full", "field 'reader'", "heldout")),
    ('says = "Test 2 best against the seed\'s figure, chance-corrected"\n', "", "missing key",
     ("T2-best-full", "'says' is missing")),
    ("target = 0.826", 'target = "0.826"', "wrong type", ("T2-best-full", "field 'target' must be a float")),
    ("target = 0.826", "target = 82.6", "out of range", ("T2-best-full", "field 'target'", "82.6")),
    ("target = 0.826\n", "", "a rule without its figure", ("T2-best-full", "'target' is missing", "'seed_figure'")),
    ("select = { test = 2,", "select = { test = [2],", "a list selecting", ("T2-best-full", "field 'select'")),
    ("select = { test = 2, shots = 0, n_items = 10042 }", "select = 3", "wrong type", ("T2-best-full", "'select'")),
    (FIRST, FIRST + 'colour = "red"\n', "unknown key", ("T2-best-full", "field 'colour' is not one of")),
    (FIRST, '[[claim]]\nid = 3\n', "an id not a string", ("claim 1:", "field 'id' must be a str")),
    (FIRST, '[[claim]]\nid = "T2 best"\n', "an id with a space", ("claim 1:", "field 'id'", "T2 best")),
    ('file = "docs/results/report_full', 'file = "docs/results/../report_full', "a file leading out",
     ("T2-best-full", "field 'file'", "docs/results/")),
    ('id = "T2-below-full"', 'id = "T2-best-full"', "an id twice",
     ("claim 2 (T2-best-full): field 'id' repeats claim 1's",)),
    (COSTED, "", "{cost} without a cost", ("T1-best-full-set", "field 'why'", "{cost}")),
    ('entry = "Test 1 on all 10,042 items", ', "", "a cost without its entry", ("T1-best-full-set", "'entry'")),
    (FIRST, FIRST.replace("claim", "claims", 1), "not a [[claim]] table", ("field 'claims' is not one of",)),
    ('rule = "seed_figure"', "rule = ", "not TOML", ("not valid TOML",)),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "what", "words"), FAULTS, ids=[f[2] for f in FAULTS])
def test_a_planted_fault_in_the_data_file_is_one_line_naming_the_claim_and_the_key(
    tmp_path: Path, old: str, new: str, what: str, words: tuple[str, ...]
) -> None:
    path = _planted(tmp_path, old, new)
    with pytest.raises(InputError) as e:
        load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and all(w in msg for w in words), (what, msg)


def _without(claim: str, key: str) -> tuple[str, str]:
    """The lines of ``key`` (one, or a multi-line string's) in the table of ``claim``, and nothing in their place."""
    text = DATA.read_text(encoding="utf-8")
    at = text.index(f"{key} = ", text.index(f'id = "{claim}"\n'))
    multi = text.startswith('"""', at + len(key) + 3)
    end = text.index('"""\n', at + len(key) + 6) + 4 if multi else text.index("\n", at) + 1
    return text[at:end], ""


def test_a_claim_without_a_file_says_why_and_names_no_reader(tmp_path: Path) -> None:
    bare = 'id = "shared-weights"\n'
    with pytest.raises(InputError, match=r"\(shared-weights\): field 'rule' is given but not 'file'"):
        load(_planted(tmp_path, bare, bare + 'rule = "tilt"\n'))
    with pytest.raises(InputError, match=r"\(shared-weights\): field 'why' is missing"):
        load(_planted(tmp_path, *_without("shared-weights", "why")))
    with pytest.raises(InputError, match=r"\(T2-best-full\): field 'reader' is missing"):
        load(_planted(tmp_path, *_without("T2-best-full", "reader")))


def _copy(tmp_path: Path) -> Path:
    p = tmp_path / "copy.toml"
    shutil.copyfile(DATA, p)
    return p


def test_an_edited_number_of_the_data_file_is_an_edited_render(tmp_path: Path) -> None:
    same, edited = load(_copy(tmp_path)), load(_planted(tmp_path, "target = 0.826", "target = 0.777"))
    before, after = render(ROOT, same), render(ROOT, edited)
    assert before == (ROOT / "docs/claims.md").read_text(encoding="utf-8")  # the copy renders the docs' table
    assert "0.826" in _row(before, "T2-best-full") and "0.777" not in before
    assert "0.777" in _row(after, "T2-best-full") and "0.826" not in _row(after, "T2-best-full")
    assert [ln for ln in after.splitlines() if "0.777" in ln] == [_row(after, "T2-best-full")]


def _root_with_timings(tmp_path: Path, edit: Callable[[str], str] = lambda t: t) -> Path:
    """A repository with no result file but the Test 1 full set's timings (``edit``-ed)."""
    p = tmp_path / T1_TIMINGS
    p.parent.mkdir(parents=True)
    p.write_text(edit((ROOT / T1_TIMINGS).read_text(encoding="utf-8")), encoding="utf-8")
    return tmp_path


def _moved(text: str) -> str:
    return text.replace("~1 h 50 min", "~1 h 51 min")


def test_a_cost_is_read_from_its_timings_file_when_the_table_is_rendered(tmp_path: Path) -> None:
    assert "~1 h 50 min" in (ROOT / T1_TIMINGS).read_text(encoding="utf-8")
    committed, edited = _root_with_timings(tmp_path / "a"), _root_with_timings(tmp_path / "b", _moved)
    for root, figure in ((committed, "~1 h 50 min"), (edited, "~1 h 51 min")):
        row = _row(render(root), "T1-best-full-set")
        assert f"a resumable run of {figure} of one thread" in row and "{cost}" not in row, row
    row = _row(render(tmp_path), "T1-best-full-set")  # no timings file there: said, never a number from code
    assert "an unrecorded time (docs/results/test1_fullset/timings.txt is missing)" in row


def test_every_cost_of_the_registry_is_in_its_committed_timings_file() -> None:
    costed = [c for c in CLAIMS if c.cost]
    assert {c.cost.timings for c in costed if c.cost} == {
        T1_TIMINGS,
        "docs/results/test2_fullset/timings.txt",
        "docs/results/selection/timings.txt",
    }
    for c in costed:
        assert c.cost and TIME.fullmatch(cost(c.cost, ROOT)), c.id
        assert "{cost}" not in why(c, ROOT) and cost(c.cost, ROOT) in why(c, ROOT)
    assert not [c.id for c in CLAIMS if "{cost}" in c.why and not c.cost]


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda t: t.replace("# Test 1 on all", "# Test one on all"), ("0 sections start with", "Test 1 on all")),
        (lambda t: t.replace("# total", "# sum"), ("0 lines starting 'total'",)),
        (lambda t: t.replace("~1 h 50 min", "about two hours"), ("holds no time",)),
        (lambda t: t + "#\n# Test 1 on all 10,042 items, again\n# total  ~1 h\n", ("2 sections start with",)),
    ],
)
def test_a_timings_file_without_its_cost_is_one_line(
    tmp_path: Path, edit: Callable[[str], str], words: tuple[str, ...]
) -> None:
    root = _root_with_timings(tmp_path, edit)
    with pytest.raises(InputError) as e:
        render(root)
    msg = str(e.value)
    assert "\n" not in msg and T1_TIMINGS in msg and all(w in msg for w in words), msg


def test_a_timings_file_is_read_through_records(tmp_path: Path) -> None:
    """A folder where the timings file should be is refused in one line (records: regular files only)."""
    (tmp_path / T1_TIMINGS).mkdir(parents=True)
    with pytest.raises(InputError, match="is a directory, not a regular file"):
        render(tmp_path)
