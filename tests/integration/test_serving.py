"""mcpcore.serving: every service's port speaks grpc.health.v1, SERVING only once the service says so."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mcpcore.serving import GrpcService


async def test_health_follows_the_service():
    service = GrpcService(["mcpapi.v2.Example"])
    port = await service.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        with pytest.raises(grpc.aio.AioRpcError) as info:  # not ready: nothing reported for it yet
            await check(health_pb2.HealthCheckRequest(service="mcpapi.v2.Example"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        await service.set_serving()
        for name in ("", "mcpapi.v2.Example"):
            reply = await check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await service.health.enter_graceful_shutdown()  # what stop() does first
        reply = await check(health_pb2.HealthCheckRequest(service="mcpapi.v2.Example"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    await service.stop(grace_s=0.1)
