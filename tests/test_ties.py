"""The near-tie helper of tests/_ties.py: it tolerates a different pick, rank or top-k entry only where the
reference scores are within the stated tolerance, and fails (listing the difference) everywhere else."""

from __future__ import annotations

import numpy as np
import pytest

from _ties import TIE_ATOL, TIE_RTOL, assert_picks_match, assert_ranks_match, assert_same_picks, assert_topk_match, near


def test_near_is_relative_with_a_small_absolute_floor() -> None:
    assert near(100.0, 100.0 + 0.5 * TIE_RTOL * 100)
    assert not near(100.0, 100.0 + 2 * TIE_RTOL * 100)
    assert near(0.0, 0.5 * TIE_ATOL) and not near(0.0, 10 * TIE_ATOL)


def test_picks_equal_or_near_tied_pass_and_report_the_ties() -> None:
    ref = np.array([[0.1, 0.9, 0.3, 0.2], [5.0, 5.0 * (1 + TIE_RTOL / 4), 1.0, 0.0]])
    assert assert_picks_match([1, 1], ref) == []
    ties = assert_picks_match([1, 0], ref)  # item 1: ending 0 is within the tolerance of ending 1
    assert len(ties) == 1 and ties[0].startswith("(1, 0): 0")


def test_a_pick_that_differs_without_a_tie_fails() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(50, 4))
    picks = ref.argmax(-1)
    assert assert_picks_match(picks, ref) == []
    wrong = picks.copy()
    wrong[17] = (picks[17] + 1) % 4  # random normals: no two endings within 1e-4 of each other here
    with pytest.raises(AssertionError, match=r"1 differ without a near-tie.*\(17, 0\)"):
        assert_picks_match(wrong, ref, "unit")


def test_topk_and_ranks() -> None:
    ref = np.array([[3.0, 1.0, 2.0, 2.0 * (1 - TIE_RTOL / 10), -1.0]])
    assert assert_topk_match([[0, 2, 3]], ref) == []
    assert len(assert_topk_match([[0, 3, 2]], ref)) == 2  # swapped near-tied pair: tolerated, reported
    with pytest.raises(AssertionError, match="without a near-tie"):
        assert_topk_match([[2, 0, 3]], ref)
    ids = np.array([[3]])
    assert assert_ranks_match([[2]], ref[:, None, :], ids) == []  # exact rank of token 3
    assert len(assert_ranks_match([[1]], ref[:, None, :], ids)) == 1  # tied with token 2: rank 1 or 2
    with pytest.raises(AssertionError, match="without a near-tie"):
        assert_ranks_match([[0]], ref[:, None, :], ids)  # token 0 is clearly above it


def test_same_picks_asks_for_reference_scores_only_where_they_differ() -> None:
    a = np.array([[0, 1, 2], [3, 0, 1]])
    asked: list[tuple[int, ...]] = []

    def ref(pos: tuple[int, ...]) -> list[float]:
        asked.append(pos)
        return [1.0, 1.0, 0.0, 0.0] if pos == (0, 1) else [0.0, 0.0, 1.0, 0.0]

    b = a.copy()
    b[0, 1] = 0  # near-tied (equal) reference scores: tolerated
    assert len(assert_same_picks(a, b, ref)) == 1 and asked == [(0, 1)]
    b[1, 2] = 2  # the reference prefers 2 clearly over 1: a real difference
    with pytest.raises(AssertionError, match=r"\(1, 2\)"):
        assert_same_picks(a, b, ref)
