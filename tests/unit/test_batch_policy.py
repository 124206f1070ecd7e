"""The batching policy with a fake clock: when a batch is ready, what it holds, and expiry."""

import pytest

from mcp_worker.batching.policy import BatchConfig, BatchPolicy, Request
from mcpcore.errors import InvalidArgument
from mcpcore.modelspec import DEFAULT_MAX_QUEUE_SIZE, DynamicBatching, ModelConfig, TensorSpec

A, B = ("INPUT0", "<f4", (64,)), ("INPUT0", "<f4", (32,))


def policy(max_batch_size=4, delay=0.010, preferred=(), levels=1) -> BatchPolicy:
    return BatchPolicy(
        max_batch_size=max_batch_size,
        max_queue_delay_s=delay,
        preferred_batch_sizes=preferred,
        priority_levels=levels,
    )


class Named(Request):
    __slots__ = ("name",)  # Request has slots: the tests' label needs one


def named(name, t, **kw) -> Named:
    r = Named(arrival=t, **kw)
    r.name = name
    return r


def names(batch) -> list[str]:
    return [r.name for r in batch]


def test_flush_when_max_batch_rows_are_queued():
    p = policy(max_batch_size=4)
    for i in range(3):
        p.push(named(f"r{i}", 0.0, shape_key=A))
    assert not p.ready(0.001)
    p.push(named("r3", 0.001, shape_key=A))
    assert p.ready(0.001)
    assert names(p.take_batch(0.001)) == ["r0", "r1", "r2", "r3"]
    assert len(p) == 0 and not p.ready(1.0) and p.next_wakeup() is None


def test_delay_runs_from_the_oldest_arrival_not_from_the_last_flush():
    p = policy(max_batch_size=8, delay=0.010)
    p.push(named("old", 0.000, shape_key=A))
    assert p.next_wakeup() == pytest.approx(0.010)
    assert not p.ready(0.009)
    p.push(named("new", 0.008, shape_key=A))
    assert p.next_wakeup() == pytest.approx(0.010)  # a newcomer does not push the flush back
    assert p.ready(0.010)
    assert names(p.take_batch(0.010)) == ["old", "new"]
    # Queue empty: the next request's own arrival starts the clock, however long ago the last flush was.
    p.push(named("later", 5.0, shape_key=A))
    assert not p.ready(5.009) and p.ready(5.010)


def test_higher_priority_levels_first_fifo_within_a_level():
    p = policy(max_batch_size=3, levels=3)
    for name, level, t in [("l3", 3, 0.0), ("l2a", 2, 0.1), ("l1", 1, 0.2), ("l2b", 2, 0.3), ("l2c", 2, 0.4)]:
        p.push(named(name, t, level=level, shape_key=A))
    assert names(p.take_batch(1.0)) == ["l1", "l2a", "l2b"]
    assert names(p.take_batch(1.0)) == ["l2c", "l3"]


def test_shapes_never_mix_and_the_head_decides():
    p = policy(max_batch_size=8)
    p.push(named("a1", 0.0, shape_key=A))
    p.push(named("b1", 0.1, shape_key=B))
    p.push(named("a2", 0.2, shape_key=A, rows=2))
    p.push(named("b2", 0.3, shape_key=B))
    assert names(p.take_batch(1.0)) == ["a1", "a2"]
    assert names(p.take_batch(1.0)) == ["b1", "b2"]


def test_ready_by_size_counts_rows_of_the_heads_shape_only():
    p = policy(max_batch_size=4, delay=1.0)
    p.push(named("a", 0.0, shape_key=A, rows=1))
    p.push(named("b", 0.0, shape_key=B, rows=4))
    assert not p.ready(0.5)  # B is full, but A is the head and waits for its delay
    p.push(named("a2", 0.0, shape_key=A, rows=3))
    assert p.ready(0.5)


def test_rows_never_exceed_the_max_and_order_is_not_skipped():
    p = policy(max_batch_size=4)
    for name, rows in [("r3", 3), ("r2", 2), ("r1", 1)]:
        p.push(named(name, 0.0, shape_key=A, rows=rows))
    assert names(p.take_batch(1.0)) == ["r3"]  # r2 does not fit; r1 may not jump it
    assert names(p.take_batch(1.0)) == ["r2", "r1"]


def test_preferred_sizes_before_the_delay_everything_after():
    p = policy(max_batch_size=8, delay=0.010, preferred=(2, 4))
    for i in range(7):
        p.push(named(f"r{i}", 0.0, shape_key=A))
    assert p.ready(0.001)  # the largest preferred size is queued: worth sending at once
    assert names(p.take_batch(0.001)) == ["r0", "r1", "r2", "r3"]
    assert not p.ready(0.002)  # 3 left: not a full preferred batch yet
    assert names(p.take_batch(0.002)) == ["r4", "r5"]  # taken anyway: the largest preferred that fits
    p.push(named("r7", 0.003, shape_key=A))
    assert names(p.take_batch(0.010)) == ["r6", "r7"]  # delay over: all that fits


def test_lowered_limit_runs_an_oversized_request_alone():
    p = policy(max_batch_size=8, preferred=(4, 8))
    p.push(named("big", 0.0, shape_key=A, rows=6))
    p.push(named("small", 0.0, shape_key=A, rows=1))
    p.set_max_batch_size(4)  # breaker level 1
    assert p.max_batch_size == 4
    assert names(p.take_batch(1.0)) == ["big"]
    assert names(p.take_batch(1.0)) == ["small"]


def test_expiry_removes_only_requests_past_their_deadline():
    p = policy(max_batch_size=8, delay=1.0)
    p.push(named("t5", 0.0, shape_key=A, deadline=0.005))
    p.push(named("none", 0.0, shape_key=A))
    p.push(named("t3", 0.001, shape_key=A, deadline=0.003))
    assert p.next_wakeup() == pytest.approx(0.003)
    assert p.expire(0.002) == []
    assert names(p.expire(0.005)) == ["t3", "t5"]
    assert len(p) == 1 and p.next_expiry() is None and p.next_wakeup() == pytest.approx(1.0)
    assert names(p.take_batch(1.0)) == ["none"]


def test_taken_and_removed_requests_do_not_expire():
    p = policy(max_batch_size=1, delay=0.0)
    a = named("a", 0.0, shape_key=A, deadline=1.0)
    b = named("b", 0.0, shape_key=A, deadline=1.0)
    p.push(a)
    p.push(b)
    assert p.take_batch(0.0) == [a]
    assert p.remove(b) and not p.remove(b)
    assert p.expire(2.0) == [] and len(p) == 0


def test_stale_deadlines_do_not_pile_up():
    p = policy(max_batch_size=1, delay=0.0)
    for i in range(1000):
        p.push(named(str(i), float(i), shape_key=A, deadline=1e9))
        p.take_batch(float(i))
    assert len(p._deadlines) <= 20


def test_clear_returns_everything_in_service_order():
    p = policy(levels=2)
    p.push(named("l2", 0.0, level=2, shape_key=A))
    p.push(named("b", 0.1, shape_key=B))
    p.push(named("a", 0.2, shape_key=A))
    assert names(p.clear()) == ["b", "a", "l2"]
    assert len(p) == 0 and not p.ready(9.0)


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match=r"not in 1\.\.2"):
        policy(levels=2).push(named("x", 0.0, level=3))


def _model(**kw) -> ModelConfig:
    spec = (TensorSpec("INPUT0", "FP32", (-1, 4)),)
    return ModelConfig(name="m", version="1", backend="numpy", inputs=spec, outputs=spec, **kw)


def test_batch_config_from_model_yaml_values():
    db = DynamicBatching(
        max_queue_delay_us=500,
        preferred_batch_sizes=(16, 32),
        priority_levels=2,
        default_priority_level=2,
        default_queue_timeout_us=10_000,
        max_queue_size=100,
    )
    cfg = BatchConfig.from_model_config(_model(max_batch_size=64, dynamic_batching=db))
    assert cfg == BatchConfig(64, 0.0005, (16, 32), 2, 2, 0.01, 100)
    assert cfg.batched
    plain = BatchConfig.from_model_config(_model())
    # a bounded queue even where model.yaml says nothing (DEFAULT_MAX_QUEUE_SIZE)
    assert plain == BatchConfig(max_batch_size=0, max_queue_size=DEFAULT_MAX_QUEUE_SIZE) and not plain.batched
    p = BatchPolicy.for_config(plain)
    assert p.max_batch_size == 1


def test_batch_config_rejects_bad_values():
    with pytest.raises(InvalidArgument, match="default_priority_level"):
        BatchConfig(8, priority_levels=2, default_priority_level=3)
