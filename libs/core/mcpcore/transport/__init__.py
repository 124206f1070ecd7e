"""Where mcpcore meets a transport: what is pure (``mcpcore.errors``, the records, the logic) is mapped
here to a wire's own terms, and nothing pure imports this package.

- ``grpc_status``: ``errors.Code`` to ``grpc.StatusCode`` and back, and the client table (a failed call
  back to its ``MCPError``).
- ``http_status``: ``errors.Code`` to the REST door's HTTP status (Triton's table).
- ``guarded``: ``GuardedServer``, the one place where a servicer's exceptions become gRPC statuses.
- ``aio_server``: ``AioServer``, the services' grpc.aio server, which serves again when grpc.aio ends it.
- The ZeroMQ data path to workers (the router's and the SDK's): ``forwarder`` (``Forwarder``: one per
  process), ``link`` (a worker's socket and address), ``outbox`` (coalescing and early sends),
  ``deadlines`` (the 2 ms deadline slots), ``replies`` (matching replies to requests), ``shm_lending``
  and ``shm_lease`` (same-host shared memory: memfd leases and who lends them).
"""
