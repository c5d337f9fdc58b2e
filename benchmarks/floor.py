"""The floor: the cheapest HTTP server Python can be, serving fixed bytes.

    python -m benchmarks.floor PLAIN_FILE GZIP_FILE PORT

An asyncio Protocol that answers every request on a keep-alive connection
with one of two pre-built responses (the gzip one when the request accepts
gzip), parsing nothing but that header and the blank line that ends a
request. Scraped by the same client in the same run as gpu-exporter, their
rounds taking turns, with the same bytes, it shows how much of a scrape's latency this machine,
its kernel and the client take whatever the server does: the part no
exporter change can remove.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path


class _Serve(asyncio.Protocol):
    def __init__(self, plain: bytes, gzipped: bytes) -> None:
        self.plain, self.gzipped = plain, gzipped
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            assert self.transport is not None
            gz = b"gzip" in head.lower()
            self.transport.write(self.gzipped if gz else self.plain)


def response(body: bytes, gzip: bool) -> bytes:
    """A complete HTTP/1.1 200 response carrying `body`."""
    head = (
        "HTTP/1.1 200 OK\r\n"
        "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n" + ("Content-Encoding: gzip\r\n" if gzip else "") + "\r\n"
    )
    return head.encode() + body


async def serve(plain: bytes, gzipped: bytes, port: int) -> None:
    """Serve the two bodies on 127.0.0.1:port until cancelled."""
    loop = asyncio.get_running_loop()
    resp = response(plain, False), response(gzipped, True)
    server = await loop.create_server(lambda: _Serve(*resp), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    p.add_argument("plain", type=Path, help="the body served without Accept-Encoding: gzip")
    p.add_argument("gzipped", type=Path, help="the gzip body served with it")
    p.add_argument("port", type=int)
    a = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(a.plain.read_bytes(), a.gzipped.read_bytes(), a.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
