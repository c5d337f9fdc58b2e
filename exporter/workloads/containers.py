"""``--container-labels``: which containers hold which GPU, outside Kubernetes.

Asks a Docker-compatible API (Docker, Podman) on its unix socket, as dcgm-exporter
4.8.3 does: ``GET /containers/json`` lists the running containers, and
``GET /containers/<id>/json`` tells what each holds. A container holds the GPUs of
its ``HostConfig.DeviceRequests`` (a request of driver ``nvidia`` or with the
capability ``gpu``: its ``DeviceIDs``, else ``Count`` GPUs, all when negative, the
first ``Count`` by index otherwise, as Docker's own NVIDIA hook picks them), or
without such a request those its ``NVIDIA_VISIBLE_DEVICES`` names (``all``, GPU
indexes, ``GPU-<uuid>``, ``MIG-<uuid>``, ``MIG-GPU-<uuid>/<gi>/<ci>``; ``none``,
``void``: none).

Bounded: a refresh (the list and the inspections it needs) gets :data:`REFRESH_S` and
:data:`MAX_REFRESH_BYTES` in all, and what is still under way then is cancelled (the
containers not inspected yet are asked for at the next refresh); the list may be
:data:`MAX_LIST_BYTES` long, an inspection :data:`MAX_INSPECT_BYTES`; at most
:data:`MAX_CONTAINERS` containers are looked at, each inspected once for its life (what
it holds does not change), and the cache keeps only the containers of the last list,
whatever the inspections do. Answers are decoded in a thread of the client's own, never
on the event loop. An inspection that fails leaves its container out until it answers; a
list that fails keeps the last answer.

The refresh runs beside the collection cycle (:meth:`Runtime.start`), never inside
it: the cycle uses the last answer, so a slow runtime never delays NVML collection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import aiohttp

from exporter.nvml.devices import Device
from exporter.runtime.ratelimit import RateLimited

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0  # one request
REFRESH_S = 5.0  # one refresh: the list and every inspection it needs, in all
# A hostile answer decodes into about 24 times its bytes (JSON of empty lists): 2 MiB of
# list (1024 containers of 2 KiB) peaks near 48 MiB, an inspection (5 to 20 KiB as Docker
# writes them) near 6 MiB, one at a time in the decoding thread.
MAX_LIST_BYTES = 2 << 20
MAX_INSPECT_BYTES = 256 << 10
MAX_REFRESH_BYTES = 16 << 20  # read in one refresh; the containers left are asked next time
MAX_CONTAINERS = 1024
MAX_NAME_BYTES = 128
MAX_REFS = 256  # devices one container names
MAX_REF_CHARS = 96  # a device reference longer than any MIG-GPU-<uuid>/<gi>/<ci> is dropped
PARALLEL = 8  # inspections at once
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATES = re.compile("[\ud800-\udfff]")  # no UTF-8 carries them: U+FFFD in their place
ALL = "all"


class AnswerError(Exception):
    """The runtime's API did not give a usable answer (one line)."""


@dataclass(frozen=True, slots=True)
class Holding:
    """A running container and the devices it names (GPU indexes, UUIDs, MIG forms)."""

    name: str
    refs: tuple[str, ...]


def container_name(raw: str) -> str:
    """Docker's name without its leading ``/``, control characters as ``_``, code points
    UTF-8 cannot carry as U+FFFD, at most MAX_NAME_BYTES bytes of UTF-8."""
    name = _SURROGATES.sub("\ufffd", _CONTROL.sub("_", raw.lstrip("/")))
    data = name.encode()[:MAX_NAME_BYTES]
    return data.decode("utf-8", "ignore")


def holding(inspect: Mapping[str, Any]) -> Holding | None:
    """What one ``/containers/<id>/json`` answer holds, or None (no GPU, or not a container)."""
    name = inspect.get("Name")
    if not isinstance(name, str):
        return None
    refs = _requested(inspect.get("HostConfig"))
    if refs is None:
        refs = _visible(inspect.get("Config"))
    refs = tuple(dict.fromkeys(r for r in refs[:MAX_REFS] if len(r) <= MAX_REF_CHARS))
    return Holding(container_name(name), refs) if refs else None


def _requested(host: Any) -> tuple[str, ...] | None:
    """Devices of the NVIDIA device requests; None when there is no such request."""
    reqs = host.get("DeviceRequests") if isinstance(host, dict) else None
    found: list[str] | None = None
    for r in reqs if isinstance(reqs, list) else ():
        if not isinstance(r, dict) or not _is_gpu(r):
            continue
        found = found or []
        ids = r.get("DeviceIDs")
        count = r.get("Count")
        if isinstance(ids, list) and ids:
            found += [str(i) for i in ids if isinstance(i, str | int)][:MAX_REFS]
        elif isinstance(count, int) and count < 0:
            found.append(ALL)
        elif isinstance(count, int):
            found += [str(i) for i in range(min(count, MAX_REFS))]
    return tuple(found) if found is not None else None


def _is_gpu(request: Mapping[str, Any]) -> bool:
    if request.get("Driver") == "nvidia":
        return True
    caps = request.get("Capabilities")
    return isinstance(caps, list) and any(isinstance(c, list) and "gpu" in c for c in caps)


def _visible(config: Any) -> tuple[str, ...]:
    env = config.get("Env") if isinstance(config, dict) else None
    for item in env if isinstance(env, list) else ():
        if isinstance(item, str) and item.startswith("NVIDIA_VISIBLE_DEVICES="):
            value = item.split("=", 1)[1].strip()
            if value in ("", "none", "void"):
                return ()
            return tuple(v.strip() for v in value.split(",") if v.strip())[:MAX_REFS]
    return ()


def by_device(held: Iterable[Holding], devices: Iterable[Device]) -> dict[str, tuple[str, ...]]:
    """Device key -> names of the containers holding it. A container holding a GPU holds
    its MIG instances too (their series are the GPU's under ``-d f``)."""
    devs = list(devices)
    gpus = {d.key: d for d in devs if not d.is_mig}
    kids: dict[str, list[Device]] = {}
    for d in devs:
        if d.is_mig and d.parent is not None:
            kids.setdefault(d.parent.key, []).append(d)
    out: dict[str, list[str]] = {}
    for h in held:
        keys: dict[str, None] = {}
        for ref in h.refs:
            for d in _match(ref, gpus.values(), devs):
                keys[d.key] = None
                for kid in kids.get(d.key, ()) if not d.is_mig else ():
                    keys[kid.key] = None
        for key in keys:
            if h.name not in out.setdefault(key, []):
                out[key].append(h.name)
    return {k: tuple(v) for k, v in out.items()}


def _match(ref: str, gpus: Iterable[Device], devs: list[Device]) -> list[Device]:
    if ref == ALL:
        return list(gpus)
    if ref.isdigit():
        return [g for g in gpus if g.index == int(ref)]
    if ref.startswith("MIG-GPU-"):  # MIG-GPU-<uuid>/<gi>/<ci> (drivers before R470)
        uuid, _, rest = ref[4:].partition("/")
        gi, _, ci = rest.partition("/")
        return [
            d for d in devs
            if d.is_mig and d.uuid == uuid and str(d.gi) == gi and (not ci or str(d.ci) == ci)
        ]  # fmt: skip
    return [d for d in devs if d.key == ref]  # GPU-<uuid>, or a MIG instance's MIG-<uuid>


def _ids(listed: Any) -> list[str]:
    """The container IDs of a ``/containers/json`` answer."""
    if not isinstance(listed, list):
        raise AnswerError("the container list is not a JSON list")
    return [c["Id"] for c in listed if isinstance(c, dict) and isinstance(c.get("Id"), str)]


def _held(inspected: Any) -> Holding | None:
    return holding(inspected) if isinstance(inspected, dict) else None


class Runtime:
    """The container runtime's answers, asked at most once per ``interval_s``."""

    def __init__(self, socket: str, interval_s: float) -> None:
        self.socket = socket
        self.interval_s = interval_s
        self.held: tuple[Holding, ...] = ()
        self.up = False
        self._seen: dict[str, Holding | None] = {}  # container ID -> what it holds
        self._asked = float("-inf")
        self._session: aiohttp.ClientSession | None = None
        self._warn = RateLimited(60.0)
        self._task: asyncio.Task[None] | None = None
        self._read_bytes = 0  # this refresh's answers so far
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runtime-json")

    def start(self) -> None:
        """Begin a refresh beside the caller (the collection cycle) unless one is under way;
        the caller goes on with :attr:`held` as it stands."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.refresh(), name="container-runtime")

    async def refresh(self) -> None:
        """Ask the runtime again if the last answer is an interval old; on failure keep it."""
        now = time.monotonic()
        if now - self._asked < self.interval_s:
            return
        self._asked = now
        self._read_bytes = 0
        failed = 0
        try:
            async with asyncio.timeout(REFRESH_S):
                ids = await self._get("/containers/json", MAX_LIST_BYTES, _ids)
                if len(ids) > MAX_CONTAINERS:
                    self._warn.log(log, logging.WARNING, "--container-runtime-socket: %d "
                                   "containers; looking at the first %d", len(ids),
                                   MAX_CONTAINERS)  # fmt: skip
                    ids = ids[:MAX_CONTAINERS]
                # only the listed containers stay cached, whatever the inspections do
                self._seen = {i: self._seen[i] for i in ids if i in self._seen}
                failed = await self._inspect([i for i in ids if i not in self._seen])
        except (AnswerError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            if self.up or self._warn.ready() is not None:
                why = f"no answer in {REFRESH_S:g} s" if isinstance(e, TimeoutError) else str(e)
                log.warning("--container-runtime-socket %s: %s; keeping the last answer",
                            self.socket, why[:200] or type(e).__name__)  # fmt: skip
            self.up = False
            return
        self.held = tuple(h for h in self._seen.values() if h is not None)
        if failed:
            self._warn.log(log, logging.WARNING, "--container-runtime-socket %s: %d inspections "
                           "failed; those containers are asked again", self.socket,
                           failed)  # fmt: skip
        if not self.up:
            log.info("--container-runtime-socket %s: %d containers hold GPUs",
                     self.socket, len(self.held))  # fmt: skip
        self.up = True

    async def _inspect(self, ids: list[str]) -> int:
        """Inspect ``ids``, caching what each holds; returns how many failed. Cancelling
        it (the refresh's deadline) cancels every inspection under way."""
        gate = asyncio.Semaphore(PARALLEL)

        async def one(cid: str) -> bool:
            async with gate:
                try:
                    got = await self._get(f"/containers/{cid}/json", MAX_INSPECT_BYTES, _held)
                except AnswerError as e:
                    return "404" in str(e)  # gone since the list: not held, not failed
                except (aiohttp.ClientError, OSError, ValueError):
                    return False
            self._seen[cid] = got
            return True

        valid = [i for i in ids if re.fullmatch(r"[0-9A-Za-z_.-]{1,128}", i)]
        done = await asyncio.gather(*(one(i) for i in valid))
        return done.count(False)

    async def _get(self, path: str, max_bytes: int, read: Callable[[Any], Any]) -> Any:
        """``read`` of the JSON answer to ``GET path``, decoded in the client's thread."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket),
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
            )
        too_big = f"GET {path[:80]}: answer larger than {max_bytes >> 10} KiB"
        async with self._session.get(f"http://localhost{path}") as resp:
            if resp.status != 200:
                raise AnswerError(f"GET {path[:80]}: HTTP {resp.status}")
            if (resp.content_length or 0) > max_bytes:
                raise AnswerError(too_big)
            chunks, size = [], 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                self._read_bytes += len(chunk)
                if size > max_bytes:
                    raise AnswerError(too_big)
                if self._read_bytes > MAX_REFRESH_BYTES:
                    raise AnswerError(f"more than {MAX_REFRESH_BYTES >> 20} MiB in one refresh")
            body = b"".join(chunks)
        del chunks
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decoder, _decode, path, body, read)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._session is not None:
            await self._session.close()
        self._decoder.shutdown(wait=False, cancel_futures=True)


def _decode(path: str, body: bytes, read: Callable[[Any], Any]) -> Any:
    try:
        return read(json.loads(body))
    except (ValueError, RecursionError):
        raise AnswerError(f"GET {path[:80]}: not JSON") from None
