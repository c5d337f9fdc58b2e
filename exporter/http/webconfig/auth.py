"""Basic auth: bcrypt checks off the event loop, bounded in concurrency, with results cached.

As exporter-toolkit does, the outcome of a bcrypt check is cached under a digest of
user, stored hash and password: the real scraper is checked once, not per scrape, and
a flood of wrong passwords cannot starve it. The cache survives a reload of the web
config (the stored hash is part of the key, so a changed password is checked afresh).
bcrypt runs in a small thread pool of its own; past a bounded queue a request gets a
503 at once instead of waiting behind the flood.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import bcrypt

BCRYPT_MAX_BYTES = 72
WORKERS = 2
"""bcrypt checks run at once (threads), at most."""
QUEUE = 32
"""bcrypt checks waiting for a thread, at most; more get 503 at once."""
CACHE = 1024
"""Cached outcomes (user, hash, password digests), least recently used dropped first."""


@functools.lru_cache(maxsize=32)
def decoy(cost: int) -> bytes:
    """A hash of a random password with ``cost``: unknown users are checked against it,
    so that they cost as much as known ones (computed once per cost)."""
    return bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(cost))


def basic_credentials(header: str | None) -> tuple[str | None, bytes]:
    """(user, password) from an Authorization header; user None when it is not Basic."""
    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() != "basic" or len(value) > 4096:
        return None, b""
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
        user, sep, password = decoded.partition(b":")
        return (user.decode() if sep else None), password
    except ValueError:  # binascii.Error, UnicodeDecodeError, non-ASCII text
        return None, b""


def check(password: bytes, hashed: bytes) -> bool:
    """bcrypt's own comparison, which takes the same time whether or not the password matches.
    Passwords longer than bcrypt reads are refused (bcrypt would ignore the rest)."""
    too_long = len(password) > BCRYPT_MAX_BYTES
    ok = bcrypt.checkpw(password[:BCRYPT_MAX_BYTES], hashed)
    return ok and not too_long


class Authenticator:
    """Checks Basic credentials against a user -> bcrypt hash mapping."""

    def __init__(self, workers: int = WORKERS, queue: int = QUEUE, cache: int = CACHE) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="bcrypt")
        self._max_pending = workers + queue
        self._pending = 0
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache

    async def authorized(self, users: Mapping[str, bytes], header: str | None) -> bool | None:
        """True/False: whether ``header`` carries a user of ``users`` and its password.
        None: too many checks are in progress; answer 503 and let the client retry."""
        user, password = basic_credentials(header)
        if user is None:
            return False
        hashed = users.get(user)
        target = hashed if hashed is not None else decoy(_cost(users))
        key = hashlib.sha256(b"\0".join((user.encode(), target, password))).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached and hashed is not None
        if self._pending >= self._max_pending:
            return None
        self._pending += 1
        try:
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(self._executor, check, password, target)
        finally:
            self._pending -= 1
        self._cache[key] = ok
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return ok and hashed is not None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _cost(users: Mapping[str, bytes]) -> int:
    return max((int(h[4:6]) for h in users.values()), default=10)
