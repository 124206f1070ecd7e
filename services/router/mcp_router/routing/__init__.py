"""Where a request goes: the version (split, breaker fallback), the worker (consistent hashing with
bounded loads) and a sequence's pin. Pure logic: no I/O, no gRPC, ZeroMQ or etcd."""
