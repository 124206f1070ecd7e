"""A TCP proxy that can partition the link it carries: ``python tcp_proxy.py LISTEN TARGET``.

It relays ``LISTEN`` (host:port) to ``TARGET`` and prints one JSON line once listening. SIGUSR1 cuts the
link as a network partition does: no RST, no FIN, bytes in both directions vanish (read and dropped) and
new connections are accepted but never reach the target, so each side learns of it only from its own
timeouts (ZeroMQ heartbeats). SIGUSR2 heals it: the connections of the partition are closed (their byte
streams lost data, as TCP's would have timed out) and relaying resumes, so peers reconnect.

A separate process, so that the test's own threads (load, checks) never slow the relay down.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys


class Proxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.cut = False
        self.links: set[asyncio.StreamWriter] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.links.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.cut:  # accepted, never forwarded: a SYN into a partition
                await self._drain(reader)
                return
            up_reader, upstream = await asyncio.open_connection(*self.target)
            self.links.add(upstream)
            await asyncio.gather(self._pump(reader, upstream), self._pump(up_reader, writer))
        except OSError:
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self.links.discard(w)
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            if not self.cut:
                writer.write(data)
                await writer.drain()
        writer.close()  # the peer closed: pass the close on (unless partitioned, then nobody sees it)

    @staticmethod
    async def _drain(reader: asyncio.StreamReader) -> None:
        while await reader.read(1 << 16):
            pass

    def partition(self) -> None:
        self.cut = True

    def heal(self) -> None:
        self.cut = False
        for w in list(self.links):
            w.transport.abort()
        self.links.clear()


async def main(listen: str, target: str) -> None:
    host, port = listen.rsplit(":", 1)
    to_host, to_port = target.rsplit(":", 1)
    proxy = Proxy((to_host, int(to_port)))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, proxy.partition)
    loop.add_signal_handler(signal.SIGUSR2, proxy.heal)
    server = await asyncio.start_server(proxy.serve, host, int(port), reuse_address=True)
    print(json.dumps({"listen": listen, "target": target}), flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
