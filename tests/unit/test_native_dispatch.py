"""mcp_native.grpc_server's dispatch: every call the transport hands over is finished exactly once.

The transport (grpc++) is replaced here by a recording stand-in so that events can arrive in orders a
real client produces only by chance: a cancellation in the same batch as its call's start (the task
is cancelled before it ever ran), a cancellation after the finish, events for calls never seen. The
real transport's behaviour is tested in tests/integration/test_native_grpc_server.py.
"""

from __future__ import annotations

import asyncio

import grpc

from mcp_native.grpc_server import NativeServer

START, MESSAGE, HALF_CLOSE, CANCEL, WRITTEN = range(5)


class RecordingDoor:
    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.finished: list[tuple] = []
        self.writes: list[tuple] = []
        self.reads: list[int] = []
        self.queued: list[int] = []  # finished with later=True, not yet handed over by wake()
        self.wakes: list[list[int]] = []  # what each wake() handed over

    def take(self) -> list[tuple]:
        events, self.events = self.events, []
        return events

    def finish(self, call_id, code, details, reply=None, trailers=(), later=False) -> bool:
        self.finished.append((call_id, code, details, reply))
        if later:
            self.queued.append(call_id)
        return True

    def wake(self) -> None:
        self.wakes.append(self.queued)
        self.queued = []

    def write(self, call_id, data) -> bool:
        self.writes.append((call_id, data))
        return True

    def read(self, call_id) -> None:
        self.reads.append(call_id)

    def metadata(self, call_id) -> tuple:
        return ()


def server_with(door: RecordingDoor) -> NativeServer:
    server = NativeServer.__new__(NativeServer)  # no transport: the door above stands in for it
    server._handlers = {}
    server._generic = []
    server._calls = {}
    server._door = door
    server._loop = None
    server._wake_scheduled = False

    async def echo(request: bytes, context) -> bytes:
        await asyncio.sleep(0)
        return request

    async def chat(requests, context):
        async for r in requests:
            yield r

    server.add_registered_method_handlers(
        "t.T",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )
    return server


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_call_cancelled_in_the_batch_that_started_it_is_finished_once():
    async def main() -> None:
        door = RecordingDoor()
        server = server_with(door)
        door.events = [(START, 1, "/t.T/Echo", b"x", None), (CANCEL, 1)]
        server._events()
        await settle()
        assert door.finished == [(1, grpc.StatusCode.CANCELLED.value[0], "Cancelled", None)]
        assert server._calls == {}

    asyncio.run(main())


def test_late_and_unknown_events_are_ignored_and_each_call_finishes_once():
    async def main() -> None:
        door = RecordingDoor()
        server = server_with(door)
        door.events = [(START, 7, "/t.T/Echo", b"hello", 5.0), (CANCEL, 99), (WRITTEN, 98)]
        server._events()
        await settle()
        door.events = [(CANCEL, 7), (MESSAGE, 7, b"late")]  # after its finish: nothing happens
        server._events()
        await settle()
        assert door.finished == [(7, 0, "", b"hello")]

    asyncio.run(main())


def test_the_answers_of_one_loop_iteration_are_handed_over_with_one_wake():
    async def main() -> None:
        door = RecordingDoor()
        server = server_with(door)
        server._loop = asyncio.get_running_loop()
        door.events = [(START, i, "/t.T/Echo", b"%d" % i, None) for i in (1, 2, 3)]
        server._events()  # the three handlers answer in the same iteration
        await settle()
        assert sorted(c for c, *_ in door.finished) == [1, 2, 3]
        assert [sorted(w) for w in door.wakes] == [[1, 2, 3]] and door.queued == []
        door.events = [(START, 4, "/t.T/Echo", b"4", None)]
        server._events()
        await settle()
        assert door.wakes[1:] == [[4]]  # a later answer: its own wake

    asyncio.run(main())


def test_an_unknown_method_is_answered_unimplemented_without_a_task():
    async def main() -> None:
        door = RecordingDoor()
        server = server_with(door)
        door.events = [(START, 3, "/t.T/Nope", b"", None)]
        server._events()
        assert door.finished == [(3, grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!", None)]
        assert server._calls == {}

    asyncio.run(main())


def test_a_stream_reads_only_when_its_handler_asks_and_ends_on_cancel():
    async def main() -> None:
        door = RecordingDoor()
        server = server_with(door)
        door.events = [(START, 5, "/t.T/Chat", None, None)]
        server._events()
        await settle()
        assert door.reads == [5]  # one read asked for, none more until a message comes
        door.events = [(MESSAGE, 5, b"a")]
        server._events()
        await settle()
        assert door.writes == [(5, b"a")] and door.reads == [5, 5]
        door.events = [(CANCEL, 5)]
        server._events()
        await settle()
        assert door.finished == [(5, grpc.StatusCode.CANCELLED.value[0], "Cancelled", None)]
        assert door.queued == []  # a stream ends in order after its writes, never kept for later

    asyncio.run(main())
