"""ModelStreamInfer's stream: many requests in flight on one gRPC stream, their answers sent back as they
come (``serve``), for plain and decoupled models alike.

Invariants:
- Every request on the stream runs at once, at most ``IN_FLIGHT`` (reading the client's stream waits past
  that, so gRPC flow control pushes back); each answer carries its request's id, and an error is an answer
  (``error_message``), never the end of the stream.
- Bounded both ways: a request's slot is held until its last answer was sent, and at most ``ANSWERS`` of
  a decoupled model's answers wait to be sent: past that the request that brought one more drops the rest
  of its answers and fails, in band, RESOURCE_EXHAUSTED (a worker cannot be made to wait).
- With "triton_enable_empty_final_response" (Triton's), each answer says "triton_final_response" false
  and the last, empty for a decoupled model, says true; without it a decoupled model's empty last answer
  is not sent.
- When the client goes away, every request still running is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from mcp_router.frontends.kserve_codec import EMPTY_FINAL
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpcore.errors import MCPError, ResourceExhausted, log_unexpected

__all__ = ["ANSWERS", "FINAL", "IN_FLIGHT", "Infer", "serve"]

IN_FLIGHT = 1024  # requests of one stream running at once
ANSWERS = 4096  # decoupled answers of one stream waiting to be sent
FINAL = "triton_final_response"

#: Runs one request; a decoupled model's answers before its last go to the callback as they come.
Infer = Callable[
    [pb.ModelInferRequest, Callable[[pb.ModelInferResponse], None]], Awaitable[pb.ModelInferResponse]
]
_Item = tuple[pb.ModelStreamInferResponse | None, bool]  # (an answer or None, whether it is its last)


async def serve(
    requests: AsyncIterator[pb.ModelInferRequest], infer: Infer
) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """The answers to ``requests``, each run with ``infer``, in the order they come."""
    state = _Stream(infer)
    reader = asyncio.create_task(state.read(requests))
    try:
        while (item := await state.answers.get()) is not None:
            answer, last = item
            if not last:
                state.waiting -= 1
            if answer is not None:
                yield answer
            if last:
                state.slots.release()
    finally:
        reader.cancel()
        for task in list(state.running):
            task.cancel()
    if state.failure:
        raise state.failure[0]


class _Stream:
    """One stream's requests in flight and answers waiting."""

    def __init__(self, infer: Infer) -> None:
        self.infer = infer
        self.answers: asyncio.Queue[_Item | None] = asyncio.Queue()  # None: every answer is out
        self.slots = asyncio.Semaphore(IN_FLIGHT)
        self.running: set[asyncio.Task[None]] = set()
        self.failure: list[BaseException] = []
        self.waiting = 0  # decoupled answers queued and not sent yet

    async def read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for request in requests:
                await self.slots.acquire()
                task = asyncio.create_task(self.one(request))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
            await asyncio.gather(*self.running)
        except Exception as exc:  # the request stream broke: answer what ran, then fail the call
            self.failure.append(exc)
        finally:
            await self.answers.put(None)  # the client closed its side (or it broke) and every answer is out

    async def one(self, request: pb.ModelInferRequest) -> None:
        final = _flag(request, EMPTY_FINAL)
        dropped = 0

        def partial(response: pb.ModelInferResponse) -> None:
            nonlocal dropped
            if dropped or self.waiting >= ANSWERS:
                dropped += 1  # this request's answers stop here; its last one says why
                return
            if final:
                response.parameters[FINAL].bool_param = False
            self.waiting += 1
            self.answers.put_nowait((pb.ModelStreamInferResponse(infer_response=response), False))

        try:
            response = await self.infer(request, partial)
            if dropped:
                raise ResourceExhausted(
                    f"{dropped} answers were dropped: {ANSWERS} answers of this stream were waiting for the "
                    "client to read them; read the stream faster"
                )
            if final:
                response.parameters[FINAL].bool_param = True
            last = response if final or response.outputs else None  # a decoupled model's is often empty
            answer = None if last is None else pb.ModelStreamInferResponse(infer_response=last)
        except MCPError as err:
            answer = _error(request, err.message)
        except Exception as exc:  # never past the stream: the others go on
            answer = _error(request, log_unexpected(exc, "ModelStreamInfer").message)
        await self.answers.put((answer, True))  # its slot is freed once it has been sent


def _flag(request: pb.ModelInferRequest, key: str) -> bool:
    param = request.parameters.get(key)
    return param is not None and param.WhichOneof("parameter_choice") == "bool_param" and param.bool_param


def _error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """A failed request's answer on a stream: the message, and what identifies the request."""
    response = pb.ModelInferResponse(
        id=request.id, model_name=request.model_name, model_version=request.model_version
    )
    return pb.ModelStreamInferResponse(error_message=message, infer_response=response)
