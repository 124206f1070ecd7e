"""The reconciler's work queue: each model once, FIFO, retries when their backoff ends."""

from __future__ import annotations

from mcp_scheduler.workqueue import WorkQueue


def test_a_model_is_queued_once_however_often_it_changes_and_comes_out_in_order():
    q = WorkQueue()
    for m in ["a", "b", "a", "c", "b", "a"]:
        q.add(m)
    assert len(q) == 3
    assert q.take(2) == ["a", "b"]
    q.add("a")  # changed again after it was taken: queued again, behind c
    assert q.take(10) == ["c", "a"]
    assert q.take(10) == []


def test_a_retry_is_queued_when_its_time_comes_and_no_time_asked_for_is_lost():
    q = WorkQueue()
    q.add_after("m", 10.0)
    q.add_after("m", 5.0)
    assert q.next_due() == 5.0
    assert q.due(4.9) == 0 and not q
    assert q.due(5.0) == 1 and q.take(5) == ["m"]
    assert q.due(9.9) == 0 and not q
    assert q.due(10.0) == 1 and q.take(5) == ["m"]  # the later retry still comes (its backoff ended)
    assert q.next_due() is None


def test_models_waiting_for_room_go_first():
    q = WorkQueue()
    q.add_all(["b", "c"])
    q.add_first(["a", "c"])
    assert q.take(10) == ["a", "c", "b"]


def test_a_model_queued_meanwhile_is_taken_once_when_its_retry_comes_due():
    q = WorkQueue()
    q.add_after("m", 1.0)
    q.add("m")
    q.due(2.0)
    assert q.take(5) == ["m"]
    assert not q
