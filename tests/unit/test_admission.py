"""Admission at the worker's door: hard bounds, and a fair share between models (pure logic, fake clock)."""

from __future__ import annotations

import pytest

from mcp_worker.tensor_server.admission import Admission
from mcpcore.errors import Unavailable


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(**kw) -> tuple[Admission, Clock]:  # type: ignore[no-untyped-def]
    clock = Clock()
    return Admission(max_requests=8, max_bytes=1000, owner="worker w1", clock=clock, **kw), clock


def test_a_model_alone_may_fill_the_worker_and_no_more() -> None:
    adm, _ = make()
    tickets = [adm.admit("a", 10) for _ in range(8)]
    with pytest.raises(Unavailable, match="exceeds maximum queue size: worker w1 holds 8 requests") as info:
        adm.admit("a", 10)
    assert info.value.not_started and adm.refused_total == 1
    adm.release(tickets[0])
    adm.release(tickets[0])  # twice: counted once
    assert adm.requests == 7
    adm.admit("a", 10)


def test_bytes_in_flight_are_bounded_too() -> None:
    adm, _ = make()
    adm.admit("a", 900)
    with pytest.raises(Unavailable, match="900 bytes of tensors and this request brings 200"):
        adm.admit("a", 200)
    adm.admit("a", 100)


def test_a_hog_beside_a_light_model_is_held_to_its_share() -> None:
    adm, clock = make()
    hog = [adm.admit("hog", 1) for _ in range(8)]
    with pytest.raises(Unavailable):
        adm.admit("light", 1)  # the light model asked: it is active for a second
    for t in hog:
        adm.release(t)
    for _ in range(4):
        adm.admit("hog", 1)
    with pytest.raises(Unavailable, match="shared by 2 models and model hog holds its share"):
        adm.admit("hog", 1)
    for _ in range(4):
        adm.admit("light", 1)  # its room was kept
    clock.now += 5  # long after: a model with nothing in flight and no refusal is not active
    assert adm.requests == 8


def test_names_from_the_network_do_not_grow_the_table() -> None:
    adm, clock = make()
    for i in range(1000):
        adm.release(adm.admit(f"model-{i}", 1))
    assert len(adm._use) == 0  # admitted and answered: forgotten at once
    hold = [adm.admit("x", 1) for _ in range(8)]
    for i in range(200):
        with pytest.raises(Unavailable):
            adm.admit(f"junk-{i}", 1)
        clock.now += 0.1  # refusals older than a second are pruned as the table grows
    assert len(adm._use) <= 64 + 12
    assert hold
