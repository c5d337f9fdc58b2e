"""``--hpc-job-mapping-dir``: which HPC jobs use which GPU, from files a scheduler writes.

As dcgm-exporter reads them: a directory of files named by GPU index (``0``, ``1``) or
``<gpu>.<gpu instance>`` for a MIG instance (``2.0``), each holding job IDs, one a
line (Slurm's prolog writes a GPU's file, its epilog removes it). Other names and
subdirectories are ignored. The directory is read again every cycle, in the collection
thread; a directory that is missing is logged once (and again once it is back and gone
again), not an error.

Bounded: at most :data:`MAX_FILES` job files of :data:`MAX_FILE_BYTES` each, and
:data:`MAX_JOBS` IDs of at most :data:`MAX_ID_CHARS` characters per file; blank lines
and surrounding spaces are dropped. What lies past a bound is left out, with one
warning a minute.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from types import MappingProxyType

from exporter.config.files import ConfigFileError, read_config_bytes
from exporter.runtime.ratelimit import RateLimited

log = logging.getLogger(__name__)

MAX_ENTRIES = 4096  # directory entries looked at per cycle
MAX_FILES = 1024  # job files read per cycle
MAX_FILE_BYTES = 64 * 1024
MAX_JOBS = 64  # job IDs per file
MAX_ID_CHARS = 128
_NAME = re.compile(r"\d{1,5}(\.\d{1,5})?")  # "3" or "3.10", as dcgm-exporter's pattern
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

JobMap = Mapping[str, tuple[str, ...]]  # file name ("0", "2.0") -> job IDs


class JobFiles:
    """Reads the job directory; :meth:`read` once per cycle."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._missing: bool | None = None  # None: not looked yet
        self._warn = RateLimited(60.0)

    def read(self) -> JobMap:
        """File name -> job IDs, for files that list at least one."""
        try:
            entries = os.scandir(self.directory)
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
        with entries:
            for n, entry in enumerate(entries):
                if n >= MAX_ENTRIES or len(out) >= MAX_FILES:
                    self._over(f"more than {MAX_FILES} job files or {MAX_ENTRIES} entries")
                    break
                if not _NAME.fullmatch(entry.name) or entry.is_dir(follow_symlinks=False):
                    continue
                jobs = self._jobs(entry.path, entry.name)
                if jobs:
                    out[entry.name] = jobs
        return MappingProxyType(out)

    def _jobs(self, path: str, name: str) -> tuple[str, ...]:
        try:  # regular files only, size-bounded: a FIFO or a huge file is skipped
            raw = read_config_bytes(path, "HPC job file", MAX_FILE_BYTES)
        except ConfigFileError as e:
            if os.path.lexists(path):  # else removed since listed (a job's epilog): no news
                self._over(str(e))
            return ()
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

    def _over(self, what: str) -> None:
        self._warn.log(log, logging.WARNING, "--hpc-job-mapping-dir %s: %s; left out",
                       self.directory, what)  # fmt: skip
