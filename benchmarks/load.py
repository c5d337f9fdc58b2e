"""Scrape load: N concurrent scrapers against 127.0.0.1, each on its own connection.

The client speaks just enough HTTP/1.1 to be cheap: one GET, the status line,
Content-Length (or read to the end when the server closes), and the body. A
connection is kept alive when the server allows it, as Prometheus does; a
server that closes after each response (HTTP/1.0) is dialled again, and that
time counts in the latency because a real scraper pays it too.

A *round* fires one request on every scraper at the same instant, so with N
scrapers each request waits behind the others: the burst a node sees when N
Prometheus servers scrape it at once. Rounds are spread over a few seconds, one at a
random point of each equal slot, so they land at every phase of the exporter's
collection cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass


class ScrapeError(RuntimeError):
    """A scrape did not return 200 with a body."""


class Scraper:
    def __init__(self, host: str, port: int, path: str, gzip: bool) -> None:
        self.host, self.port = host, port
        enc = "Accept-Encoding: gzip\r\n" if gzip else ""
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{enc}"
            "User-Agent: gpu-exporter-bench\r\nAccept: text/plain\r\n\r\n"
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def get(self) -> tuple[float, int]:
        """One scrape: (seconds from send to the last body byte, body bytes)."""
        t0 = time.perf_counter()
        if self.writer is None:
            await self._connect()
        assert self.reader is not None and self.writer is not None
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        if " 200 " not in status_line + " ":
            raise ScrapeError(status_line)
        length = None
        close = status_line.startswith("HTTP/1.0")
        for line in lines:
            name, _, val = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(val)
            elif name == "connection":
                close = val.strip().lower() == "close"
        if length is None:
            body = await self.reader.read()
            close = True
        else:
            body = await self.reader.readexactly(length)
        elapsed = time.perf_counter() - t0
        if close:
            await self.close()
        return elapsed, len(body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


@dataclass(frozen=True)
class LoadResult:
    """Latencies of one load run, seconds."""

    scrapers: int
    gzip: bool
    body_bytes: int
    seconds: float  # wall time of the run
    latencies: tuple[float, ...]  # every scrape's, in order

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p99(self) -> float:
        return percentile(list(self.latencies), 99)

    @property
    def max(self) -> float:
        return max(self.latencies)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


async def paced(rounds: int, gap: float) -> AsyncIterator[int]:
    """0 to rounds - 1, each when its round is due: at a random point of its own slot of
    ``gap`` seconds. Rounds a fixed gap apart would meet a 1 s cycle at one phase only (a
    40 ms gap comes back to the same 25 phases every second), so a run would meet the
    collection either every time or never."""
    phase = random.Random()
    start = time.perf_counter()
    for k in range(rounds):
        delay = start + (k + phase.random()) * gap - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield k


async def _run(
    ports: list[int], scrapers: int, rounds: int, spread_s: float, gzip: bool, path: str
) -> list[LoadResult]:
    """``rounds`` rounds on each port, taking turns: each slot is split into one part per
    port, the order turning by one each slot, and a port's round fires at a random point of
    its part. A run that takes turns with another server within every slot shares with it
    whatever else the machine is doing at the time, which seconds-long runs in turn do not."""
    m = len(ports)
    clients = [[Scraper("127.0.0.1", port, path, gzip) for _ in range(scrapers)] for port in ports]
    latencies: list[list[float]] = [[] for _ in ports]
    size = [0] * m
    t_start = time.perf_counter()
    try:
        # One untimed round per port opens the connections.
        for group in clients:
            await asyncio.gather(*(c.get() for c in group))
        async for j in paced(rounds * m, spread_s / rounds / m):
            slot, part = divmod(j, m)
            i = (part + slot) % m
            results = await asyncio.gather(*(c.get() for c in clients[i]))
            for lat, n in results:
                latencies[i].append(lat)
                size[i] = n
    finally:
        await asyncio.gather(*(c.close() for group in clients for c in group))
    seconds = time.perf_counter() - t_start
    return [LoadResult(scrapers, gzip, size[i], seconds, tuple(latencies[i])) for i in range(m)]


async def fetch(port: int, gzip: bool, path: str = "/metrics") -> tuple[int, int]:
    """One scrape on a fresh connection: (200, body bytes); raises ScrapeError otherwise."""
    client = Scraper("127.0.0.1", port, path, gzip)
    try:
        _, size = await client.get()
    finally:
        await client.close()
    return 200, size


def scrape_load(
    port: int,
    scrapers: int,
    requests: int,
    spread_s: float,
    gzip: bool,
    path: str = "/metrics",
) -> LoadResult:
    """Run about `requests` scrapes (at least 5 rounds) in rounds of `scrapers` at once."""
    rounds = max(5, requests // scrapers)
    return asyncio.run(_run([port], scrapers, rounds, spread_s, gzip, path))[0]


def scrape_pair(
    ports: tuple[int, int], scrapers: int, requests: int, spread_s: float, gzip: bool
) -> tuple[LoadResult, LoadResult]:
    """``scrape_load`` on two servers at once, their rounds taking turns within each slot."""
    rounds = max(5, requests // scrapers)
    a, b = asyncio.run(_run(list(ports), scrapers, rounds, spread_s, gzip, "/metrics"))
    return a, b
