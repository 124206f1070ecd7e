"""How a service proves itself to etcd: ``EtcdAuth`` (TLS and username/password settings) and the etcd token
that rides on every call of an authenticated connection (``mcpcore.etcd_connection`` uses both).

Invariants:
- A password is only ever sent over TLS: ``EtcdAuth`` refuses a user without a CA, and checks its files
  when it is built (at start), so a bad setting fails there, naming the field.
- ``EtcdToken.keep`` authenticates on a background task and renews the token every ``TOKEN_RENEW_S`` and
  whenever ``invalid`` is called (etcd said the token is not valid); it retries while etcd is unreachable
  and never dies silently. A refused password is remembered in ``refused`` (and logged) until a later
  ``Authenticate`` succeeds.
- Until the first token, calls carry none; the token is never sent on ``Authenticate`` itself (etcd refuses
  any request carrying a stale token, as after its restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
from etcd3aio._protobuf import AuthenticateRequest, AuthStub

from mcpcore.tls import TLSConfig

__all__ = ["NOT_AUTHENTICATED", "TOKEN_RENEW_S", "EtcdAuth", "EtcdToken", "says_not_authenticated"]

log = logging.getLogger(__name__)

TOKEN_RENEW_S = 100.0  # etcd's simple tokens live 300 s (--auth-token-ttl) unless used
#: What etcd says when a call carries no token, or one it no longer knows.
NOT_AUTHENTICATED = ("user name is empty", "invalid auth token", "token is invalid", "auth store is old")


def says_not_authenticated(detail: str) -> bool:
    return any(s in detail for s in NOT_AUTHENTICATED)


@dataclass(frozen=True)
class EtcdAuth:
    """How a service proves itself to etcd and checks etcd's certificate (each service's ``etcd_auth``
    config section: env ``MCP_<SERVICE>_ETCD_AUTH__USER`` ...)."""

    #: etcd's CA: set, the service speaks TLS to etcd and verifies it.
    ca_file: str = ""
    #: A client certificate and key, where etcd is run with --client-cert-auth.
    cert_file: str = ""
    key_file: str = ""
    #: etcd user (``etcdctl user add``) and a file holding its password (a mounted secret, not an env var).
    user: str = ""
    password_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.user) != bool(self.password_file):
            raise ValueError("etcd_auth: user and password_file go together")
        if self.user and not self.ca_file:
            raise ValueError("etcd_auth: a user needs ca_file: the password would cross the network in clear")
        if self.password_file and not Path(self.password_file).is_file():
            raise ValueError(f"etcd_auth.password_file: no such file {self.password_file!r}")
        self.tls  # noqa: B018  (checks the certificate files now, at start)

    @property
    def tls(self) -> TLSConfig:
        return TLSConfig(ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file)

    def password(self) -> str:
        return Path(self.password_file).read_text().strip()


class EtcdToken(grpc.AuthMetadataPlugin):
    """The current etcd token on every call (none before the first ``Authenticate``), and the loop that
    keeps it fresh."""

    def __init__(self) -> None:
        self.value = ""
        self.refused = ""  # etcd refused the password: every call says so
        self._renew = asyncio.Event()
        self.answered = asyncio.Event()  # etcd answered an Authenticate (a token or a refusal)

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        # never on Authenticate itself: etcd refuses any request with a stale token (after a restart)
        fresh = not context.method_name.endswith("Authenticate")
        callback((("token", self.value),) if self.value and fresh else (), None)

    def invalid(self) -> None:
        """etcd said the token is expired or not issued yet: renew it now."""
        self._renew.set()

    async def keep(
        self,
        channel: grpc.aio.Channel,
        auth: EtcdAuth,
        *,
        endpoints: str,
        deadline_s: float,
        transient: frozenset[grpc.StatusCode],
        backoff_s: tuple[float, float],
    ) -> None:
        """Authenticate now, then again every TOKEN_RENEW_S or when ``invalid`` is called."""
        stub = AuthStub(channel)
        low, high = backoff_s
        backoff = low
        while True:
            try:
                reply = await stub.Authenticate(
                    AuthenticateRequest(name=auth.user, password=auth.password()), timeout=deadline_s
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in transient or says_not_authenticated(exc.details() or ""):
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, high)
                    continue
                self.refused = f"etcd at {endpoints} refused user {auth.user!r}: {exc.details()}"
                log.error("%s (check etcd_auth.user and etcd_auth.password_file)", self.refused)
                self.answered.set()
            else:
                self.value, self.refused, backoff = reply.token, "", low
            self.answered.set()
            self._renew.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._renew.wait(), TOKEN_RENEW_S)
