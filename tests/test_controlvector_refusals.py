"""Control vectors refuse what they cannot be: a NaN or infinite direction at construction (not only when written),
and a GGUF tensor name whose layer is not plain ASCII digits (``direction.١``: Python's ``int`` reads Arabic-Indic
and full-width digits, llama.cpp's ``std::stoi`` does not), each in one line."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walklens.analyses.controlvectors import ControlVector, control_vector, read_control_vector, write_control_vector
from walklens.base.errors import InputError
from walklens.testing import tiny_model


def fuzz(examples: int) -> Any:
    """Bounded, reproducible hypothesis settings."""
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


@pytest.fixture(scope="module")
def lm() -> Any:
    return tiny_model("llama")


def _one_line(e: pytest.ExceptionInfo[InputError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_direction_is_refused_at_construction(lm: Any, bad: float) -> None:
    v = torch.ones(32)
    v[3] = bad
    with pytest.raises(InputError) as e:
        control_vector(lm, v, [1], 2.0)
    assert "NaN or infinite" in _one_line(e)
    with pytest.raises(InputError) as e:
        ControlVector({1: v}, "llama")
    assert "direction.1 holds NaN or infinite numbers" in _one_line(e)


def test_an_overflowing_direction_is_refused_not_zeroed(lm: Any) -> None:
    """Entries near float64's top: the norm overflows; the direction is still the unit vector along them."""
    cv = control_vector(lm, torch.full((32,), 1e300, dtype=torch.float64), [1], 2.0)
    assert torch.allclose(cv.directions[1], torch.full((32,), 2.0 / math.sqrt(32)))


@fuzz(80)
@given(
    values=st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1e-320, 1e300, -1e308])),
        min_size=32,
        max_size=32,
    ),
    alpha=st.sampled_from([1.0, -3.0, 1e-30, 1e6]),
)
def test_fuzz_control_vector_directions(lm: Any, values: list[float], alpha: float) -> None:
    """Any 32 numbers as a direction: one line, or a control vector of finite numbers."""
    try:
        cv = control_vector(lm, torch.tensor(values, dtype=torch.float64), [1], alpha)
    except InputError as e:
        assert "\n" not in str(e)
    else:
        assert all(bool(torch.isfinite(v).all()) for v in cv.directions.values())


def _gguf(path: Path, names: list[str], n: int = 32) -> Path:
    """A control-vector GGUF whose tensors have the given names (one row of ``n`` ones each)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    for name in names:
        w.add_tensor(name, np.ones(n, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


UNICODE_DIGITS = ["١", "۱", "१", "１", "𝟏", "¹", "①", "1١"]


@pytest.mark.parametrize("digits", UNICODE_DIGITS)
def test_a_layer_in_other_digits_than_ascii_is_refused(digits: str, tmp_path: Path) -> None:
    path = _gguf(tmp_path / "cv.gguf", [f"direction.{digits}"])
    with pytest.raises(InputError) as e:
        read_control_vector(path)
    assert "is not direction.N" in _one_line(e)


@pytest.mark.parametrize(
    "names,why",
    [
        (["direction.1", "direction.01"], "name layer 1"),
        (["direction.1 "], "is not direction.N"),
        (["direction.+1"], "is not direction.N"),
        (["direction.-1"], "is not direction.N"),
        (["direction." + "9" * 30], "is not direction.N"),
        (["direction.1\n"], "is not direction.N"),
    ],
)
def test_a_layer_name_llama_cpp_would_not_read_alike_is_refused(names: list[str], why: str, tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        read_control_vector(_gguf(tmp_path / "cv.gguf", names))
    assert why in _one_line(e)


@fuzz(60)
@given(st.text(alphabet=st.sampled_from("0123456789١۱१１𝟏¹.+- \nx"), min_size=1, max_size=12))
def test_fuzz_tensor_names(tmp_path_factory: pytest.TempPathFactory, tail: str) -> None:
    """``direction.<anything of digits and near-digits>``: the layer of its ASCII digits, or one line."""
    path = _gguf(tmp_path_factory.mktemp("cv") / "cv.gguf", [f"direction.{tail}"])
    try:
        cv = read_control_vector(path)
    except InputError as e:
        assert "\n" not in str(e)
        assert not (tail.isascii() and tail.isdigit() and 0 < int(tail) < 10**9), (tail, str(e))
    else:
        assert tail.isascii() and tail.isdigit() and cv.layers == [int(tail)]


def test_a_written_vector_still_reads_back(lm: Any, tmp_path: Path) -> None:
    cv = control_vector(lm, " cat", [1], 2.0)
    back = read_control_vector(write_control_vector(cv, tmp_path / "cat.gguf"), lm)
    assert back.layers == [1] and torch.equal(back.directions[1], cv.directions[1])
