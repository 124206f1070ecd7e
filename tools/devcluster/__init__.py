"""The development cluster: ``make up`` / ``make down`` / ``make status``, and the test etcd.

Not part of the SDK (``mcpclient``): nothing here is needed to talk to a mesh. It starts real processes on
one machine, without containers, for development, the tests, the benchmarks and the compose demo:

- ``launcher``: ``python -m mcp_devcluster up|down|status`` (etcd, two workers, the scheduler, the router
  and the health service on DESIGN.md section 13's ports; pid files and logs in ``.run/``);
- ``secure``: ``make up SECURE=1``'s identities and each service's settings for them (TLS, etcd users,
  CURVE), and what it prints to reach the cluster;
- ``certs``: ``make certs``, a test CA and every identity a secured mesh needs;
- ``demo``: the demo models it loads (``DEMO``, also compose's ``init``) and the demo client it runs;
- ``localetcd``: a real single-member etcd as a child process (the tests' and benchmarks' etcd);
- ``config``: the environment it reads, and nothing else here reads it.

It may import ``mcpapi``, ``mcpcore`` and ``mcpclient``, never a service: it starts them as processes.
"""
