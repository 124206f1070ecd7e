"""ModelStreamInfer's stream (mcp_router.frontends.kserve_stream) over a fake infer: ids, errors in band,
final flags, and the bound on a decoupled model's answers waiting for a slow client."""

from __future__ import annotations

import asyncio

from mcp_router.frontends import kserve_stream as stream
from mcp_router.frontends.kserve_codec import EMPTY_FINAL
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpcore.errors import NotFound


def _request(rid: str, n: int, *, final: bool = False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id=rid)
    request.parameters["n"].int64_param = n
    if final:
        request.parameters[EMPTY_FINAL].bool_param = True
    return request


async def _decoupled(request: pb.ModelInferRequest, partial) -> pb.ModelInferResponse:  # type: ignore[no-untyped-def]
    n = request.parameters["n"].int64_param
    if n < 0:
        raise NotFound("no such thing")
    for i in range(n):
        answer = pb.ModelInferResponse(id=request.id)
        answer.outputs.add(name=f"chunk{i}")
        partial(answer)
    return pb.ModelInferResponse(id=request.id)  # a decoupled model's last reply: empty


async def _requests(*items: pb.ModelInferRequest):  # type: ignore[no-untyped-def]
    for item in items:
        yield item


async def _all(*items: pb.ModelInferRequest) -> list[pb.ModelStreamInferResponse]:
    return [a async for a in stream.serve(_requests(*items), _decoupled)]


async def test_answers_carry_their_ids_and_errors_are_answers():
    got = await _all(_request("a", 2), _request("bad", -1), _request("b", 1))
    by_id: dict[str, list[str]] = {}
    for answer in got:
        by_id.setdefault(answer.infer_response.id, []).append(
            answer.error_message or answer.infer_response.outputs[0].name
        )
    assert by_id == {"a": ["chunk0", "chunk1"], "bad": ["no such thing"], "b": ["chunk0"]}


async def test_final_flags_only_when_asked():
    got = await _all(_request("f", 2, final=True))
    assert [a.infer_response.parameters[stream.FINAL].bool_param for a in got] == [False, False, True]
    assert len(got[-1].infer_response.outputs) == 0
    assert all(stream.FINAL not in a.infer_response.parameters for a in await _all(_request("g", 2)))


async def test_answers_waiting_past_the_bound_fail_their_request_in_band(monkeypatch):
    monkeypatch.setattr(stream, "ANSWERS", 8)
    got = await _all(_request("flood", 20))  # nothing is read until all 20 came: 12 would have to wait
    assert [a.infer_response.outputs[0].name for a in got[:8]] == [f"chunk{i}" for i in range(8)]
    assert (
        len(got) == 9
        and "12 answers were dropped: 8 answers of this stream were waiting" in got[8].error_message
    )
    again = await _all(_request("next", 3))  # the bound is per stream, and freed as answers go out
    assert len(again) == 3 and not any(a.error_message for a in again)


async def test_a_client_that_goes_away_cancels_what_runs():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(request, partial):  # type: ignore[no-untyped-def]
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    answers = stream.serve(_requests(_request("x", 0)), slow)
    waiter = asyncio.ensure_future(answers.__anext__())
    await started.wait()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await answers.aclose()
    await asyncio.wait_for(cancelled.wait(), 5)
