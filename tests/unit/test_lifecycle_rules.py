"""The transition table itself, with no store: every pair of states is legal or illegal on purpose."""

from __future__ import annotations

import itertools

import pytest

from mcpcore.errors import FailedPrecondition
from mcpcore.lifecycle import TRANSITIONS, ReplicaState, check_transition, is_legal

S = ReplicaState
PLANNED = {
    (S.IDLE, S.LOADING), (S.IDLE, S.ERROR),
    (S.LOADING, S.READY), (S.LOADING, S.ERROR),
    (S.READY, S.RUNNING), (S.READY, S.UNLOADING),
    (S.RUNNING, S.PAUSED), (S.RUNNING, S.UNLOADING),
    (S.PAUSED, S.RUNNING), (S.PAUSED, S.UNLOADING),
    (S.UNLOADING, S.IDLE), (S.UNLOADING, S.ERROR),
    (S.ERROR, S.RECOVERING),
    (S.RECOVERING, S.IDLE),
}  # fmt: skip
FAILURES = {(s, S.ERROR) for s in S if s is not S.ERROR}
LEGAL = PLANNED | FAILURES


def test_table_is_design_section_5():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == PLANNED


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(S, S)), ids=lambda s: s.value)
def test_every_pair(src, dst):
    assert is_legal(src, dst) == ((src, dst) in LEGAL)
    if (src, dst) in LEGAL:
        check_transition(src, dst)
    else:
        with pytest.raises(FailedPrecondition, match=f"illegal transition {src.value} -> {dst.value}"):
            check_transition(src, dst)


def test_error_message_lists_the_way_out():
    with pytest.raises(FailedPrecondition, match=r"from ERROR it may go to RECOVERING$"):
        check_transition(S.ERROR, S.RUNNING)
