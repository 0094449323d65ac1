"""How the CPU threads wait: passively, so that a busy machine slows a run in proportion instead of stalling it.

PyTorch's CPU wheels run their parallel regions on GNU OpenMP, whose default wait policy spins a thread that
waits for the others of its team.  When another process holds one of the cores, every operation's barrier
waits for a thread that is not running, and the spinning ones take the CPU the others need: on this 2-core
machine one competing process made ``walklens hellaswag test1 --limit 60`` 2.3x slower than quiet with the
default policy and 1.5x with ``OMP_WAIT_POLICY=PASSIVE`` (``benchmarks/bench_busy.py``, docs/dtype.md).

The policy is read once, when the OpenMP runtime loads with torch, so :func:`prefer_passive_wait` must run
before the first ``import torch``; ``walklens/__init__.py`` calls it first thing.  A policy the user set
(``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``) is left alone, as is a process that imported torch already (the
policy can no longer change there; :func:`wait_policy` says which one holds).
"""

from __future__ import annotations

import os
import sys

__all__ = ["prefer_passive_wait", "wait_policy"]

_SET_BY_WALKLENS = "_WALKLENS_SET_WAIT_POLICY"


def prefer_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process and its children unless the user chose a policy or torch
    is already loaded; returns whether it was set here."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return False
    if "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ[_SET_BY_WALKLENS] = "PASSIVE"  # inherited by child processes, with the policy itself
    return True


def wait_policy() -> str:
    """The wait policy in force, in words: 'passive (walklens)', 'passive (user)', an explicit user setting, or
    'default (spinning)'."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    if policy is None:
        spin = os.environ.get("GOMP_SPINCOUNT")
        return f"GOMP_SPINCOUNT={spin} (user)" if spin is not None else "default (spinning)"
    who = "walklens" if os.environ.get(_SET_BY_WALKLENS) == policy else "user"
    return f"{policy.lower()} ({who})"
