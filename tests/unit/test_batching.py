"""The dynamic batcher on a real event loop and a real thread pool, with tiny numpy models.

Synchronization is by events: a ``Gate`` blocks ``run_batch`` in its thread until the test opens it, and
tells the loop when it has started. The only real waits are for a max_queue_delay or a queue timeout to
elapse (<= 20 ms).
"""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mcp_worker.batching import BatchConfig, Dispatcher, ModelShare
from mcp_worker.batching import dispatcher as dispatching
from mcpcore.errors import DeadlineExceeded, Internal, InvalidArgument, ResourceExhausted, Unavailable

SHARE = ModelShare(priority=1, latency_sensitivity=0.5)
BLOCK = -1.0  # a request whose first value is BLOCK waits for the gate inside run_batch


class Gate:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.started = asyncio.Event()
        self._open = threading.Event()

    def block(self) -> None:  # in the executor thread
        self._loop.call_soon_threadsafe(self.started.set)
        if not self._open.wait(5):
            raise TimeoutError("the test never opened the gate")

    def open(self) -> None:
        self._open.set()


class Model:
    """OUTPUT0 = 2 * INPUT0 + 1, row by row; records every batch it ran (its first column)."""

    def __init__(self, name: str = "m", gate: Gate | None = None, log: list | None = None) -> None:
        self.name, self.gate = name, gate
        self.batches: list[list[float]] = []
        self.log = log if log is not None else []

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["INPUT0"]
        self.batches.append(x.reshape(len(x), -1)[:, 0].tolist())
        self.log.append(self.name)
        if self.gate is not None and x.flat[0] == BLOCK:
            self.gate.block()
        return {"OUTPUT0": x * 2 + 1}


def cfg(max_batch_size: int = 64, delay: float = 0.0, **kw) -> BatchConfig:
    return BatchConfig(max_batch_size=max_batch_size, max_queue_delay_s=delay, **kw)


def row(value: float, width: int = 4, rows: int = 1, dtype=np.float32) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((rows, width), value, dtype=dtype)}


async def ask(queue, request_id: str, inputs: dict[str, np.ndarray], **kw) -> dict[str, np.ndarray]:
    """One request through ``enqueue`` (the worker's one way in), its answer awaited."""
    future = asyncio.get_running_loop().create_future()

    def done(result) -> None:  # type: ignore[no-untyped-def]
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    queue.enqueue(request_id, inputs, done, **kw)
    return await future


async def settle() -> None:
    """Let every task created so far run up to its first wait (call_soon is FIFO)."""
    await asyncio.sleep(0)


@pytest.fixture
async def make():
    executor = ThreadPoolExecutor(max_workers=4)
    made: list[Dispatcher] = []

    def factory(**kw) -> Dispatcher:
        made.append(Dispatcher(executor=executor, **kw))
        return made[-1]

    yield factory
    for d in made:
        await d.close()
    executor.shutdown(wait=True)


async def blocked(d: Dispatcher, queue, gate: Gate) -> asyncio.Task:
    """Occupy the (single) slot with a batch held at the gate."""
    task = asyncio.create_task(ask(queue, "gate", row(BLOCK)))
    await asyncio.wait_for(gate.started.wait(), 5)
    assert d.in_flight_ids() == ["gate"]
    return task


async def test_concurrent_requests_batch_and_each_caller_gets_its_own_rows(make):
    model = Model()
    q = make().add_model("m/1", cfg(64, delay=0.005), model, SHARE)
    inputs = [row(i, rows=1 + i % 3) for i in range(64)]
    outs = await asyncio.gather(*(ask(q, f"r{i}", x) for i, x in enumerate(inputs)))
    for x, out in zip(inputs, outs, strict=True):
        np.testing.assert_array_equal(out["OUTPUT0"], model(x)["OUTPUT0"])
    sizes = [len(b) for b in model.batches[:-64]]
    assert max(sizes) > 1 and all(s <= 64 for s in sizes)
    stats = q.stats()
    assert stats.requests_total == 64 and stats.batches_total == len(sizes) < 64
    assert stats.mean_batch_size > 1 and 0 < stats.batch_utilization <= 1
    assert stats.queue_depth == 0 and stats.in_flight == 0


async def test_flush_after_the_delay_when_fewer_than_max_arrive(make):
    model = Model()
    q = make().add_model("m/1", cfg(64, delay=0.015), model, SHARE)
    started = time.monotonic()
    await asyncio.gather(*(ask(q, f"r{i}", row(i)) for i in range(3)))
    assert time.monotonic() - started >= 0.014
    assert model.batches == [[0.0, 1.0, 2.0]]


async def test_different_shapes_are_never_batched_together(make):
    gate = Gate()
    model = Model(gate=gate)
    d = make()
    q = d.add_model("m/1", cfg(64), model, SHARE)
    first = await blocked(d, q, gate)
    inputs = [row(1, 4), row(2, 8), row(3, 4, dtype=np.float64), row(4, 8), row(5, 4)]
    tasks = [asyncio.create_task(ask(q, f"r{i}", x)) for i, x in enumerate(inputs)]
    await settle()
    gate.open()
    outs = await asyncio.gather(first, *tasks)
    assert model.batches[1:] == [[1.0, 5.0], [2.0, 4.0], [3.0]]
    for x, out in zip(inputs, outs[1:], strict=True):
        assert out["OUTPUT0"].shape == x["INPUT0"].shape and out["OUTPUT0"].dtype == x["INPUT0"].dtype


async def test_priority_levels_are_served_in_order(make):
    gate = Gate()
    model = Model(gate=gate)
    d = make()
    q = d.add_model("m/1", cfg(1, priority_levels=3, default_priority_level=2), model, SHARE)
    first = await blocked(d, q, gate)
    tasks = [
        asyncio.create_task(ask(q, name, row(value), priority=level))
        for name, value, level in [("a", 3, 3), ("b", 2, None), ("c", 1, 1), ("d", 4, 3)]
    ]
    await settle()
    gate.open()
    await asyncio.gather(first, *tasks)
    assert model.batches == [[BLOCK], [1.0], [2.0], [3.0], [4.0]]
    # Triton's convention: past the configured levels is served at the lowest level, not refused
    assert q._admit(4) == 3 and q._admit(0) == 2 and q._admit(None) == 2
    with pytest.raises(InvalidArgument, match=r"priority level -1 is not valid for model m/1: use 1\.\.3"):
        await ask(q, "x", row(0), priority=-1)


async def test_full_queue_is_unavailable_not_started_as_triton_says(make):
    gate = Gate()
    d = make()
    q = d.add_model("m/1", cfg(1, max_queue_size=2), Model(gate=gate), SHARE)
    first = await blocked(d, q, gate)
    tasks = [asyncio.create_task(ask(q, f"r{i}", row(i))) for i in range(2)]
    await settle()
    with pytest.raises(
        Unavailable, match=r"exceeds maximum queue size: the queue of model m/1 holds 2"
    ) as info:
        await ask(q, "r2", row(2))
    assert info.value.not_started  # a router may send it to another replica
    gate.open()
    await asyncio.gather(first, *tasks)


async def test_request_still_queued_at_its_timeout_is_deadline_exceeded(make):
    gate = Gate()
    d = make()
    q = d.add_model("m/1", cfg(1, default_queue_timeout_s=5.0), Model(gate=gate), SHARE)
    first = await blocked(d, q, gate)
    ready = asyncio.create_task(ask(q, "ready", row(2)))  # ready to run, but the only slot is busy
    steps = 0
    step = d._step

    def counting_step():
        nonlocal steps
        steps += 1
        return step()

    d._step = counting_step
    with pytest.raises(
        DeadlineExceeded, match=r"waited [\d.]+ ms in the queue of m/1, over its 10 ms timeout"
    ):
        await ask(q, "late", row(1), timeout_s=0.010)
    assert steps <= 4  # woken by the requests and the deadline only: no polling while the slot is busy
    assert q.stats().queue_depth == 1
    with pytest.raises(DeadlineExceeded, match="past its deadline"):
        await ask(q, "dead", row(1), timeout_s=0.0)
    gate.open()
    await first
    assert (await ready)["OUTPUT0"][0, 0] == 5.0


async def test_pause_refuses_new_requests_but_drains_queued_ones(make):
    gate = Gate()
    d = make()
    q = d.add_model("m/1", cfg(4), Model(gate=gate), SHARE)
    first = await blocked(d, q, gate)
    queued = asyncio.create_task(ask(q, "queued", row(1)))
    await settle()
    q.refuse("is paused")
    with pytest.raises(Unavailable, match="model m/1 is paused"):
        await ask(q, "new", row(2))
    gate.open()
    await first
    assert (await queued)["OUTPUT0"][0, 0] == 3.0
    q.admit()
    assert (await ask(q, "after", row(2)))["OUTPUT0"][0, 0] == 5.0


async def test_emergency_stop_answers_queued_requests_and_lets_running_ones_finish(make):
    gate = Gate()
    d = make()
    q = d.add_model("m/1", cfg(1), Model(gate=gate), SHARE)
    first = await blocked(d, q, gate)
    tasks = [asyncio.create_task(ask(q, f"r{i}", row(i))) for i in range(3)]
    await settle()
    assert sorted(d.emergency_stop("GPU 0 lost")) == ["r0", "r1", "r2"]
    assert d.in_flight_ids() == ["gate"]
    for task in tasks:
        with pytest.raises(
            Unavailable, match="worker emergency stop: GPU 0 lost; retry on another worker"
        ) as e:
            await task
        assert e.value.retryable
    with pytest.raises(Unavailable, match="emergency stop"):
        await ask(q, "new", row(1))
    gate.open()
    assert (await first)["OUTPUT0"][0, 0] == -1.0
    assert d.in_flight_ids() == [] and d.last_active > 0


async def test_remove_model_waits_for_its_running_batch(make):
    gate = Gate()
    d = make()
    q = d.add_model("m/1", cfg(1), Model(gate=gate), SHARE)
    first = await blocked(d, q, gate)
    removal = asyncio.create_task(d.remove_model("m/1"))
    await settle()
    assert not removal.done()
    with pytest.raises(Unavailable, match="model m/1 is being unloaded"):
        await ask(q, "new", row(1))
    gate.open()
    await asyncio.wait_for(removal, 5)
    assert first.done() and (first.result())["OUTPUT0"][0, 0] == -1.0
    again = d.add_model("m/1", cfg(1), Model(), SHARE)  # forgotten: the key can be served anew
    assert (await ask(again, "r", row(1)))["OUTPUT0"][0, 0] == 3.0


async def test_a_failing_batch_fails_only_its_own_requests(make):
    def picky(inputs):
        if (inputs["INPUT0"] < 0).any():
            raise ValueError("negative input")
        if (inputs["INPUT0"] > 100).any():
            raise ResourceExhausted("GPU out of memory")
        return {"OUTPUT0": inputs["INPUT0"] + 1}

    q = make().add_model("m/1", cfg(1), picky, SHARE)
    bad, oom, good = await asyncio.gather(
        ask(q, "bad", row(-5)), ask(q, "oom", row(500)), ask(q, "good", row(1)), return_exceptions=True
    )
    assert (
        isinstance(bad, Internal) and "model m/1 failed on a batch of 1 requests (ValueError)" in bad.message
    )
    assert isinstance(oom, ResourceExhausted) and oom.message == "GPU out of memory"
    assert good["OUTPUT0"][0, 0] == 2.0
    assert (await ask(q, "later", row(2)))["OUTPUT0"][0, 0] == 3.0
    t = q.totals  # ModelStatistics: the two failures counted as such, the good ones as executions
    assert (t.success_count, t.fail_count, t.execution_count, t.inference_count) == (2, 2, 2, 2)


async def test_totals_count_what_ran_as_triton_counts_it(make):
    q = make().add_model("m/1", cfg(64, delay=0.005), Model(), SHARE)
    await asyncio.gather(*(ask(q, f"r{i}", row(i, rows=2)) for i in range(8)))
    t = q.totals
    assert t.success_count == t.queue_count == t.compute_count == 8 and t.fail_count == 0
    assert t.inference_count == 16 and 1 <= t.execution_count < 8  # rows, and batches
    assert sum(b.count for b in t.batches.values()) == t.execution_count
    assert sum(size * b.count for size, b in t.batches.items()) == 16  # sizes are rows
    assert t.queue_ns > 0 and t.compute_infer_ns > 0 and t.success_ns >= t.queue_ns
    assert t.last_inference_ms > 0


async def test_wrong_outputs_are_internal_errors(make):
    q = make().add_model("m/1", cfg(4), lambda x: {"OUTPUT0": np.zeros((7, 2))}, SHARE)
    with pytest.raises(Internal, match="output OUTPUT0 is \\(7, 2\\), expected 1 rows"):
        await ask(q, "r", row(1))


async def test_bad_requests_are_invalid_arguments(make):
    q = make().add_model("m/1", cfg(4), Model(), SHARE)
    with pytest.raises(InvalidArgument, match=r"has 5 rows; it must have 1\.\.4 \(max_batch_size\)"):
        await ask(q, "r", row(1, rows=5))
    mismatch = {"INPUT0": np.zeros((2, 4)), "INPUT1": np.zeros((3, 4))}
    with pytest.raises(InvalidArgument, match="disagree on the batch dim: INPUT0 has 2 rows, INPUT1 has 3"):
        await ask(q, "r", mismatch)
    with pytest.raises(InvalidArgument, match="at least one input"):
        await ask(q, "r", {})


async def test_without_batching_each_request_runs_alone_as_is(make):
    seen = []

    def run(inputs):
        seen.append(inputs["INPUT0"].shape)
        return {"OUTPUT0": inputs["INPUT0"].sum(keepdims=True)}

    q = make().add_model("m/1", BatchConfig(max_batch_size=0), run, SHARE)
    outs = await asyncio.gather(*(ask(q, f"r{i}", {"INPUT0": np.ones((i + 1, 3))}) for i in range(3)))
    assert sorted(seen) == [(1, 3), (2, 3), (3, 3)]
    assert [o["OUTPUT0"].item() for o in outs] == [3.0, 6.0, 9.0]


async def test_breaker_ratio_halves_the_batch_size(make):
    gate = Gate()
    model = Model(gate=gate)
    d = make()
    q = d.add_model("m/1", cfg(8), model, SHARE)
    first = await blocked(d, q, gate)
    tasks = [asyncio.create_task(ask(q, f"r{i}", row(i))) for i in range(8)]
    await settle()
    q.set_batch_ratio(0.5)
    gate.open()
    await asyncio.gather(first, *tasks)
    assert [len(b) for b in model.batches[1:]] == [4, 4]
    with pytest.raises(InvalidArgument, match="batch ratio"):
        q.set_batch_ratio(0.0)


async def test_free_slots_go_to_models_by_weight(make):
    gate, log = Gate(), []
    d = make(slots=1)
    g = d.add_model("g/1", cfg(1), Model("g", gate=gate, log=log), SHARE)
    heavy = d.add_model("a/1", cfg(1), Model("a", log=log), ModelShare(3, 0.0))
    light = d.add_model("b/1", cfg(1), Model("b", log=log), ModelShare(1, 0.0))
    first = await blocked(d, g, gate)
    tasks = [asyncio.create_task(ask(q, f"{q.key}-{i}", row(i))) for i in range(40) for q in (heavy, light)]
    await settle()
    gate.open()
    await asyncio.gather(first, *tasks)
    both_ready = log[1:41]  # while both queues still had requests
    assert 25 <= both_ready.count("a") <= 34, both_ready  # weights ~0.74 : 0.26


async def test_a_slow_model_leaves_a_slot_for_an_active_fast_one(make):
    """A model's second concurrent batch may not take the last free slot while another model was used
    within ACTIVE_S (the fast one answers at once beside two held batches of the slow one); once the
    fast model is quiet for ACTIVE_S, the slow one may use every slot."""
    now = [100.0]
    gate = Gate()
    d = make(slots=2, clock=lambda: now[0])
    slow_model = Model("slow", gate=gate)
    slow = d.add_model("slow/1", cfg(1), slow_model, SHARE)
    fast = d.add_model("fast/1", cfg(1), Model("fast"), SHARE)
    await ask(fast, "f0", row(1))  # fast is active from now on
    first = await blocked(d, slow, gate)
    second = asyncio.create_task(ask(slow, "s1", row(BLOCK)))
    await settle()
    await settle()
    assert slow.stats().queue_depth == 1 and len(slow_model.batches) == 1  # held: a slot stays free
    out = await asyncio.wait_for(ask(fast, "f1", row(2)), 5)  # runs beside the held batch
    np.testing.assert_array_equal(out["OUTPUT0"], row(2)["INPUT0"] * 2 + 1)
    assert not first.done() and slow.stats().queue_depth == 1
    now[0] += dispatching.ACTIVE_S + 0.01  # fast quiet: the slow model may take the second slot
    d.wake()
    for _ in range(100):
        if len(slow_model.batches) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(slow_model.batches) == 2 and slow.stats().queue_depth == 0
    gate.open()
    await asyncio.gather(first, second)


async def test_event_loop_stays_responsive_while_a_batch_runs(make):
    gate = Gate()
    d = make()
    q = d.add_model("m/1", cfg(1), Model(gate=gate), SHARE)
    first = await blocked(d, q, gate)
    ticks = 0

    async def ticker():
        nonlocal ticks
        for _ in range(50):
            ticks += 1
            await asyncio.sleep(0)

    await asyncio.wait_for(ticker(), 5)  # completes while run_batch is still held at the gate
    assert ticks == 50 and not first.done()
    gate.open()
    await first


async def test_metrics_are_observed_per_model(make):
    class Child:
        def __init__(self):
            self.values = []

        def observe(self, v):
            self.values.append(v)

        def set(self, v):
            self.values.append(v)

    class Family:
        def __init__(self):
            self.children = {}

        def labels(self, *labels):
            return self.children.setdefault(labels, Child())

    class Metrics:  # the worker's prometheus metrics have this shape; queue_delay left out on purpose
        batch_size = Family()
        batch_utilization = Family()
        queue_depth = Family()

    m = Metrics()
    q = make(metrics=m).add_model("demo-mlp/2", cfg(4, delay=0.005), Model(), SHARE)
    await asyncio.gather(*(ask(q, f"r{i}", row(i)) for i in range(4)))
    key = ("demo-mlp", "2")
    assert m.batch_size.children[key].values == [4]
    assert m.batch_utilization.children[key].values == [1.0]
    assert m.queue_depth.children[key].values[-1] == 0


async def test_a_batchs_answers_are_spread_over_loop_iterations_and_a_stop_answers_the_rest():
    from mcp_worker.batching import request  # noqa: PLC0415  (the unit under test is private)

    n = dispatching._ANSWER_CHUNK + 6  # more than one iteration's worth
    answers: dict[int, list[object]] = {i: [] for i in range(n)}
    reqs = [request.Pending(arrival=0.0, request_id=f"r{i}", inputs=None, on_done=answers[i].append,
                              timeout_s=None) for i in range(n)]  # fmt: skip
    outs = [{"y": np.full(1, i)} for i in range(n)]
    task = asyncio.create_task(dispatching._answer_spread(reqs, outs))
    await asyncio.sleep(0)  # the task's first step: one chunk answered, then it yields
    assert sum(bool(a) for a in answers.values()) == dispatching._ANSWER_CHUNK
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # each its own, exactly once, none lost
    assert [[int(out["y"][0]) for out in answers[i]] for i in range(n)] == [[i] for i in range(n)]


async def test_enqueued_requests_are_answered_through_their_callbacks_once(make):
    """The worker's one path: no task per request, each answered once on the loop; a withdrawn one
    is never answered, and a taker that raises costs the rest of its batch nothing."""
    model = Model()
    q = make().add_model("m/1", cfg(64, delay=0.01), model, SHARE)
    got: dict[str, list] = {f"r{i}": [] for i in range(4)}
    everyone = asyncio.Event()

    def taker(name: str):  # type: ignore[no-untyped-def]
        def take(result) -> None:  # type: ignore[no-untyped-def]
            got[name].append(result)
            if name == "r0":
                raise RuntimeError("the taker's own bug")
            if all(got[n] for n in ("r0", "r2", "r3")):
                everyone.set()

        return take

    reqs = [q.enqueue(name, row(i), taker(name)) for i, name in enumerate(got)]
    q.withdraw(reqs[1])  # its sender gave up while it was still queued
    await asyncio.wait_for(everyone.wait(), 5)
    await settle()
    assert got["r1"] == [] and model.batches == [[0.0, 2.0, 3.0]]  # withdrawn: never ran
    for i in (0, 2, 3):
        [out] = got[f"r{i}"]
        np.testing.assert_array_equal(out["OUTPUT0"], model(row(i))["OUTPUT0"])
    assert q.stats().queue_depth == 0


async def test_a_refusal_at_enqueue_raises_and_calls_nothing(make):
    q = make().add_model("m/1", cfg(4, max_queue_size=1), Model(), SHARE)
    q.refuse("is paused")
    called: list = []
    with pytest.raises(Unavailable, match="paused") as refused:
        q.enqueue("r", row(1), called.append)
    assert refused.value.not_started and called == []


async def test_a_model_runs_no_more_batches_at_once_than_its_max_running(make):
    """``max_running`` (the instances of a backend whose runs cannot overlap): with 4 free slots and one
    model alone, 2 batches run and the third waits until one ends."""
    gate = Gate()
    d = make(slots=4)
    model = Model("gpu", gate=gate)
    q = d.add_model("gpu/1", cfg(1), model, SHARE, max_running=2)
    tasks = [asyncio.create_task(ask(q, f"r{i}", row(BLOCK))) for i in range(3)]
    for _ in range(100):
        if len(model.batches) == 2:
            break
        await asyncio.sleep(0.01)
    await settle()
    assert len(model.batches) == 2 and q.stats().queue_depth == 1 and q.running == 2
    gate.open()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert len(model.batches) == 3


class Threads:
    """A model that records the thread each batch ran on; slow (``sleep_s``) once told to be."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.sleep_s = 0.0

    def __call__(self, inputs: dict[str, np.ndarray], **extra: object) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        time.sleep(self.sleep_s)
        return {"OUTPUT0": inputs["INPUT0"] * 2 + 1}


class Counted:
    """The shape of a prometheus counter family: ``labels(...).inc()``."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, ...], int] = {}

    def labels(self, *labels: str):
        family = self

        class Child:
            def inc(self, n: int = 1) -> None:
                family.counts[labels] = family.counts.get(labels, 0) + n

        return Child()


async def run_one_by_one(q, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        out = await ask(q, f"r{i}", row(i))
        np.testing.assert_array_equal(out["OUTPUT0"], row(i)["INPUT0"] * 2 + 1)


async def test_a_fast_model_allowed_inline_runs_on_the_loop_after_a_window_on_the_threads(make):
    from mcp_worker.batching.inline import WINDOW  # noqa: PLC0415

    class Metrics:
        inline_batches = Counted()

    model, loop_thread = Threads(), threading.get_ident()
    q = make(inline_s=0.05, metrics=Metrics).add_model("m/1", cfg(8), model, SHARE, inline=True)
    await run_one_by_one(q, WINDOW + 4)
    assert loop_thread not in model.threads[:WINDOW]
    assert model.threads[WINDOW:] == [loop_thread] * 4
    assert Metrics.inline_batches.counts == {("m", "1"): 4}


@pytest.mark.parametrize(("inline_s", "allowed"), [(0.0, True), (0.05, False)])
async def test_inline_off_or_a_backend_that_may_not_keeps_every_batch_on_the_threads(make, inline_s, allowed):
    model, loop_thread = Threads(), threading.get_ident()
    q = make(inline_s=inline_s).add_model("m/1", cfg(8), model, SHARE, inline=allowed)
    await run_one_by_one(q, 20)
    assert loop_thread not in model.threads


async def test_a_model_that_turns_slow_goes_back_to_the_threads_within_two_batches(make):
    from mcp_worker.batching.inline import WINDOW  # noqa: PLC0415

    model, loop_thread = Threads(), threading.get_ident()
    q = make(inline_s=0.02).add_model("m/1", cfg(8), model, SHARE, inline=True)
    await run_one_by_one(q, WINDOW + 2)
    assert model.threads[-1] == loop_thread
    model.sleep_s = 0.05  # over the limit, within LEAVE_AT of it: tolerated once
    await run_one_by_one(q, 2 + WINDOW, start=100)
    assert model.threads[-(2 + WINDOW) :][:2] == [loop_thread] * 2
    assert loop_thread not in model.threads[-WINDOW:]  # back on the threads; probed again only later


async def test_a_decoupled_models_batches_never_run_inline(make):
    from mcp_worker.batching.inline import WINDOW  # noqa: PLC0415

    model, loop_thread = Threads(), threading.get_ident()
    q = make(inline_s=0.05).add_model("m/1", cfg(8), model, SHARE, inline=True)
    await run_one_by_one(q, WINDOW + 1)
    assert model.threads[-1] == loop_thread
    await ask(q, "stream", row(1), emit=lambda out: None)
    assert model.threads[-1] != loop_thread


def test_a_negative_inline_limit_is_refused():
    with pytest.raises(ValueError, match="inline_s"):
        Dispatcher(inline_s=-1)
