"""A ROUTER that speaks the wire format, for tests: doubles every tensor, answers bad frames with errors.

Run as ``python zmq_echo_server.py ENDPOINT``; prints READY once bound. Exits on a request for model "quit".
"""

from __future__ import annotations

import sys

import zmq

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import MCPError


def main(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    print("READY", flush=True)
    while True:
        identity, *frames = sock.recv_multipart(copy=False)
        try:
            msg = wire.decode(frames)
        except MCPError as err:
            sock.send_multipart([identity, wire.error_reply(None, err)])
            continue
        if msg.header.model == "quit":
            sock.send_multipart([identity, wire.error_reply(msg.header, MCPError("bye"))])
            break
        reply = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REPLY, request_id=msg.header.request_id)
        out = wire.encode(reply, {name: arr * 2 for name, arr in msg.named().items()})
        sock.send_multipart([identity, *out], copy=False)
    sock.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main(sys.argv[1])
