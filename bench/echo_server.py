"""Echo servers for the transport figures, in their own process: ``python bench/echo_server.py``.

Serves a ZeroMQ ROUTER (zero-copy), a gRPC unary echo and a length-prefixed raw TCP echo on loopback;
prints ``READY <zmq endpoint> <grpc port> <tcp port>`` and runs until killed.
"""

from __future__ import annotations

import socket
import sys
import threading
from concurrent import futures

import grpc
import zmq

LIMIT = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def zmq_echo(sock: zmq.Socket) -> None:
    while True:
        sock.send_multipart(sock.recv_multipart(copy=False), copy=False)


def tcp_echo(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle: small echoes are round trips
    buf = bytearray(16 << 20)
    while True:
        head = conn.recv(8, socket.MSG_WAITALL)
        if len(head) < 8:
            return
        view = memoryview(buf)[: int.from_bytes(head, "little")]
        got = 0
        while got < len(view):
            got += conn.recv_into(view[got:], len(view) - got)
        conn.sendall(view)


def main() -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind("tcp://127.0.0.1:0")
    threading.Thread(target=zmq_echo, args=(sock,), daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(4), options=LIMIT)
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {"Echo": echo}),))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=tcp_echo, args=(listener,), daemon=True).start()
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    print(f"READY {endpoint} {grpc_port} {listener.getsockname()[1]}", flush=True)
    sys.stdin.read()  # until the parent closes stdin or kills us


if __name__ == "__main__":
    main()
