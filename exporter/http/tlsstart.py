"""The server side of a TLS handshake on an accepted socket, with small buffers.

What ``loop.start_tls`` does, with asyncio's TLS protocol given a 16 KiB read buffer
(one TLS record) instead of 256 KiB: the buffer is allocated per connection, at accept,
before the handshake, so a flood of handshakes that never finish costs little.
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto

SHUTDOWN_S = 3.0
"""Longest a TLS connection's closing handshake (close_notify) may take, seconds."""


class _SmallBuffers(sslproto.SSLProtocol):
    """asyncio's TLS protocol with a 16 KiB read buffer (one TLS record) instead of
    256 KiB: the buffer is allocated per connection, at accept, before the handshake."""

    max_size = 16 * 1024


async def start_tls(
    raw: asyncio.Transport, protocol: asyncio.Protocol, ctx: ssl.SSLContext, timeout_s: float
) -> asyncio.Transport:
    """``loop.start_tls`` (server side) with :class:`_SmallBuffers`: the same steps."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    tls = _SmallBuffers(
        loop, protocol, ctx, waiter, server_side=True,
        # typeshed says int; asyncio takes any number of seconds (start_tls passes floats)
        ssl_handshake_timeout=timeout_s,  # type: ignore[arg-type]
        call_connection_made=False, ssl_shutdown_timeout=SHUTDOWN_S,
    )  # fmt: skip
    raw.pause_reading()  # the ClientHello waits until tls is the protocol
    raw.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, raw)
    resume = loop.call_soon(raw.resume_reading)
    try:
        await waiter
    except BaseException:
        made.cancel()
        resume.cancel()
        raise
    return tls._app_transport  # what loop.start_tls returns
