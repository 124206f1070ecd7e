"""Who may talk to the tensor socket: with CURVE on and an allow-list, only clients whose public key is
in a folder complete the handshake (ZAP, on its own thread, off the event loop)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import zmq

__all__ = ["ZAP_DOMAIN", "allow_curve_clients", "secure"]

ZAP_DOMAIN = "mcpmesh"  # the worker socket's ZAP domain; its allow-list is configured for it


def allow_curve_clients(ctx: zmq.Context[Any], folder: str) -> Any:
    """A ZAP handler on ``ctx`` (its own thread, off the event loop) that lets a CURVE client complete the
    handshake only if its public key is in ``folder`` (``*.key`` files as ``zmq.auth`` writes them: the
    routers' and SDK clients' keys). Any other key fails the handshake: it can send nothing."""
    from zmq.auth.thread import ThreadAuthenticator  # noqa: PLC0415  (only with an allow-list)

    if not Path(folder).is_dir():
        raise ValueError(f"zmq_curve_clients_dir: no such folder {folder!r}")
    auth = ThreadAuthenticator(ctx, log=logging.getLogger("mcp_worker.zap"))
    auth.start()
    auth.configure_curve(domain=ZAP_DOMAIN, location=folder)
    return auth


def secure(sock: zmq.Socket[Any], ctx: zmq.Context[Any], secret: bytes, clients_dir: str) -> Any:
    """Make ``sock`` a CURVE server with ``secret`` (before it binds): only peers that know its public key
    can connect, and with ``clients_dir`` ("" = any client key) only the clients whose keys are there.
    Returns the ZAP handler to stop at close (None without an allow-list)."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    if not clients_dir:
        return None
    auth = allow_curve_clients(ctx, clients_dir)
    # no handler answering (its thread gone) refuses every peer, instead of letting all in
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    sock.zap_domain = ZAP_DOMAIN.encode()
    return auth
