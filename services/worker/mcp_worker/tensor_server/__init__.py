"""The worker's ZeroMQ tensor socket (``mcpcore.wire``): ``server`` (its requests), ``router_socket`` (the
socket's options and how replies leave it),
``admission`` (the bounds on requests and bytes in flight: pure logic), ``replies`` (a reply's frames under
the limits), ``shared_memory`` (a same-host sender's tensors and reply region), ``curve`` (who may connect).

Nothing is imported here, so importing the pure ``admission`` module loads no ZeroMQ.
"""
