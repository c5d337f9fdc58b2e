"""``--hpc-job-mapping-dir``: which HPC jobs use which GPU, from files a scheduler writes.

As dcgm-exporter reads them: a directory of files named by GPU index (``0``, ``1``) or
``<gpu>.<gpu instance>`` for a MIG instance (``2.0``), each holding job IDs, one a
line (Slurm's prolog writes a GPU's file, its epilog removes it). Only the names of
the cycle's devices are looked up (by name, never by listing the directory), so other
files, however many, cannot hide a device's file. The directory is read again every
cycle, in the collection thread; a directory that is missing is logged once (and again
once it is back and gone again), not an error.

The exporter reads the files as root, and whoever writes the directory is less
trusted than that: a file is opened without following a symbolic link (``O_NOFOLLOW``,
relative to the directory opened once per cycle), and read only when it is a regular
file with one link (a hard link to another file is refused), owned by root or by the
directory's owner. A file refused is left out, with one warning a minute.

Bounded: at most :data:`MAX_FILES` job files of :data:`MAX_FILE_BYTES` each, and
:data:`MAX_JOBS` IDs of at most :data:`MAX_ID_CHARS` characters per file; blank lines
and surrounding spaces are dropped. What lies past a bound is left out, with one
warning a minute.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from exporter.nvml.devices import Device
from exporter.runtime.ratelimit import RateLimited

log = logging.getLogger(__name__)

MAX_FILES = 1024  # job files read per cycle
MAX_FILE_BYTES = 64 * 1024
MAX_JOBS = 64  # job IDs per file
MAX_ID_CHARS = 128
_NAME = re.compile(r"\d{1,5}(\.\d{1,5})?")  # "3" or "3.10", as dcgm-exporter's pattern
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

JobMap = Mapping[str, tuple[str, ...]]  # a file name ("0", "2.0") or device key -> job IDs


class JobFiles:
    """Reads the job directory; :meth:`read` once per cycle."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._missing: bool | None = None  # None: not looked yet
        self._warn = RateLimited(60.0)

    def by_device(self, devices: Iterable[Device]) -> JobMap:
        """Device key -> the IDs in its job file (named by ``Device.number``: ``0``,
        ``2.0``), for the devices whose file lists at least one."""
        devices = list(devices)
        files = self.read(d.number for d in devices)
        return MappingProxyType({d.key: files[d.number] for d in devices if d.number in files})

    def read(self, names: Iterable[str]) -> JobMap:
        """File name -> job IDs, for the files of ``names`` that list at least one."""
        try:
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            if not self._missing:
                log.warning(
                    "--hpc-job-mapping-dir %s: cannot read it (%s); series carry no hpc_job "
                    "until it exists",
                    self.directory,
                    e.strerror or e,
                )
            self._missing = True
            return MappingProxyType({})
        if self._missing:
            log.info("--hpc-job-mapping-dir %s: found; reading job files", self.directory)
        self._missing = False
        out: dict[str, tuple[str, ...]] = {}
        try:
            owner = os.fstat(dfd).st_uid
            for name in sorted(set(names))[:MAX_FILES]:
                if _NAME.fullmatch(name) and (jobs := self._jobs(dfd, owner, name)):
                    out[name] = jobs
        finally:
            os.close(dfd)
        return MappingProxyType(out)

    def _jobs(self, dfd: int, owner: int, name: str) -> tuple[str, ...]:
        raw = self._raw(dfd, owner, name)
        jobs: list[str] = []
        for line in raw.decode("utf-8", "replace").splitlines():
            job = _CONTROL.sub("_", line.strip())
            if not job:
                continue
            if len(job) > MAX_ID_CHARS or len(jobs) >= MAX_JOBS:
                self._over(f"job file {name}: IDs over {MAX_ID_CHARS} characters or more than "
                           f"{MAX_JOBS} IDs")  # fmt: skip
                if len(jobs) >= MAX_JOBS:
                    break
                continue
            if job not in jobs:
                jobs.append(job)
        return tuple(jobs)

    def _raw(self, dfd: int, owner: int, name: str) -> bytes:
        """The bytes of job file ``name``; b"" when absent or refused (see above)."""
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW
        try:
            fd = os.open(name, flags, dir_fd=dfd)  # non-blocking: a FIFO must not wait
        except FileNotFoundError:  # no job on this device, or removed since (an epilog)
            return b""
        except OSError as e:  # ELOOP: a symbolic link
            self._over(f"job file {name}: cannot open it without following links ({e.strerror})")
            return b""
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in (0, owner):
                self._over(f"job file {name}: not a regular file with one link, owned by root "
                           "or the directory's owner")  # fmt: skip
                return b""
            raw = b""
            while len(raw) <= MAX_FILE_BYTES and (chunk := os.read(fd, MAX_FILE_BYTES + 1)):
                raw += chunk
        except OSError as e:
            self._over(f"job file {name}: cannot read it ({e.strerror})")
            return b""
        finally:
            os.close(fd)
        if len(raw) > MAX_FILE_BYTES:
            self._over(f"job file {name}: larger than {MAX_FILE_BYTES} bytes")
            return b""
        return raw

    def _over(self, what: str) -> None:
        self._warn.log(log, logging.WARNING, "--hpc-job-mapping-dir %s: %s; left out",
                       self.directory, what)  # fmt: skip
