"""The floor: the cheapest HTTP server Python can be, serving fixed bytes.

    python -m benchmarks.floor BODY_FILE PORT [--gzip]

An asyncio Protocol that answers every request on a keep-alive connection
with the same pre-built response, parsing nothing but the blank line that ends
a request. Scraped by the same client right after gpu-exporter, it shows how
much of a scrape's latency this machine, its kernel and the client take
whatever the server does: the part no exporter change can remove.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path


class _Serve(asyncio.Protocol):
    def __init__(self, response: bytes) -> None:
        self.response = response
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            _, self.buf = self.buf.split(b"\r\n\r\n", 1)
            assert self.transport is not None
            self.transport.write(self.response)


def response(body: bytes, gzip: bool) -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\n"
        "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n" + ("Content-Encoding: gzip\r\n" if gzip else "") + "\r\n"
    )
    return head.encode() + body


async def serve(body: bytes, port: int, gzip: bool) -> None:
    loop = asyncio.get_running_loop()
    resp = response(body, gzip)
    server = await loop.create_server(lambda: _Serve(resp), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    p.add_argument("body", type=Path)
    p.add_argument("port", type=int)
    p.add_argument("--gzip", action="store_true", help="label the body gzip-encoded")
    a = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(a.body.read_bytes(), a.port, a.gzip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
