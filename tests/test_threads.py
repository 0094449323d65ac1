"""The OpenMP wait policy walklens sets before torch loads (walklens.threads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import sys, os\n"
    "pre = 'torch' in sys.modules\n"
    "import walklens\n"
    "from walklens.threads import wait_policy\n"
    "print(pre, os.environ.get('OMP_WAIT_POLICY'), wait_policy(), sep='|')\n"
)


def probe(env_extra: dict[str, str], prelude: str = "") -> list[str]:
    unset = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "_WALKLENS_SET_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", prelude + PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout
    return out.strip().split("|")


def test_passive_is_set_before_torch_loads() -> None:
    pre, policy, said = probe({})
    assert pre == "False"
    assert policy == "PASSIVE"
    assert said == "passive (walklens)"


@pytest.mark.parametrize(
    ("extra", "policy", "said"),
    [
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE", "active (user)"),
        ({"GOMP_SPINCOUNT": "300000"}, "None", "GOMP_SPINCOUNT=300000 (user)"),
    ],
)
def test_a_users_policy_is_left_alone(extra: dict[str, str], policy: str, said: str) -> None:
    assert probe(extra)[1:] == [policy, said]


def test_an_inherited_mark_does_not_claim_a_users_policy() -> None:
    """A child of a walklens process inherits the mark; a policy the user set there is still the user's."""
    assert probe({"_WALKLENS_SET_WAIT_POLICY": "PASSIVE", "OMP_WAIT_POLICY": "ACTIVE"})[2] == "active (user)"


def test_too_late_once_torch_is_loaded() -> None:
    """The policy is read when OpenMP loads with torch: after that, walklens changes nothing and says so."""
    pre, policy, said = probe({}, prelude="import torch\n")
    assert pre == "True"
    assert policy == "None"
    assert said == "default (spinning)"
