"""The floor: aiohttp alone, serving fixed bytes.

    python -m benchmarks.floor PLAIN_FILE GZIP_FILE PORT

A bare aiohttp application with one route that answers every GET with one of
two bodies (the gzip one when the request's Accept-Encoding names gzip), with
no connection guard, no auth middleware and no readiness logic. Scraped by the
same client in the same run as gpu-exporter, their rounds taking turns, with
the same bytes, it shows what the HTTP library, this machine, its kernel and
the client cost whatever the exporter adds: the scrape target is a ratio to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def app(plain: bytes, gzipped: bytes) -> web.Application:
    """One route, /metrics, serving the two bodies."""

    async def metrics(request: web.Request) -> web.Response:
        if "gzip" in request.headers.get("Accept-Encoding", "").lower():
            return web.Response(
                body=gzipped, headers={"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip"}
            )
        return web.Response(body=plain, headers={"Content-Type": CONTENT_TYPE})

    a = web.Application()
    a.router.add_get("/metrics", metrics)
    return a


async def serve(plain: bytes, gzipped: bytes, port: int) -> None:
    """Serve the two bodies on 127.0.0.1:port until cancelled."""
    runner = web.AppRunner(app(plain, gzipped), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


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
