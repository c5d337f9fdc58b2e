"""nvidia-smi as the device check reads it: where it is, how it is run, what it prints.

Every command runs with a timeout. A query field this nvidia-smi does not know
(``Field "x" is not a valid field to query.``) is dropped, or replaced by its older
spelling, and the query retried, so one unknown field never loses the others. Values
are nvidia-smi's text with ``--format=csv,noheader,nounits``; ``[N/A]``, ``N/A`` and the
other bracketed answers read as None.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Where nvidia-smi lives when it is not on PATH: the driver's usual places, the NVIDIA
# container toolkit's, and the GPU Operator's driver container mount.
PLACES = (
    "/usr/bin/nvidia-smi",
    "/usr/local/nvidia/bin/nvidia-smi",
    "/usr/local/bin/nvidia-smi",
    "/run/nvidia/driver/usr/bin/nvidia-smi",
    "/opt/nvidia/bin/nvidia-smi",
)
# newer spelling -> older one nvidia-smi accepted before it
OLDER = {
    "clocks_event_reasons.active": "clocks_throttle_reasons.active",
    "clocks_event_reasons_counters.sw_power_cap": "",
    "clocks_event_reasons_counters.sync_boost": "",
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks.current.video": "clocks.video",
}
_INVALID = re.compile(r'Field "([^"]+)" is not a valid field to query')
Run = Callable[[Sequence[str], float], str]


class SmiError(RuntimeError):
    """nvidia-smi failed, timed out or printed something this module cannot read."""


def find() -> str | None:
    """The nvidia-smi to run: PATH first, then the usual install places."""
    found = shutil.which("nvidia-smi")
    if found:
        return found
    return next((p for p in PLACES if os.access(p, os.X_OK)), None)


def runner(binary: str) -> Run:
    """run(args, timeout) -> stdout of ``binary args``; SmiError on failure or timeout."""

    def run(args: Sequence[str], timeout: float) -> str:
        try:
            p = subprocess.run(
                [binary, *args], capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise SmiError(
                f"nvidia-smi {' '.join(args)[:80]}: no answer in {timeout:.0f} s"
            ) from None
        except OSError as e:
            raise SmiError(f"cannot run {binary}: {e}") from None
        if p.returncode != 0:
            raise SmiError((p.stdout + p.stderr).strip()[:500] or f"exit status {p.returncode}")
        return p.stdout

    return run


def value(text: str) -> str | None:
    """A cell as printed, or None for nvidia-smi's "no value" answers ([N/A], N/A, ...)."""
    text = text.strip()
    if not text or text == "N/A" or (text.startswith("[") and text.endswith("]")):
        return None
    return text


@dataclass(frozen=True)
class GpuInstance:
    gpu: int
    profile: str  # "1g.10gb"
    profile_id: int
    gi: int
    ci: int = -1  # -1: a GPU instance row (-lgi), else its compute instance (-lci)


@dataclass
class Smi:
    """One node's nvidia-smi (or the simulator's stand-in, through ``run``)."""

    run: Run
    timeout: float = 20.0
    dropped: list[str] = field(default_factory=list)  # query fields this nvidia-smi lacks
    _renamed: dict[str, str] = field(default_factory=dict)

    def query(self, fields: Sequence[str]) -> tuple[dict[int, dict[str, str | None]], float]:
        """{GPU index: {field: value}} and the monotonic time the answer came (its middle)."""
        wanted = [f for f in fields if f not in self.dropped]
        for _ in range(len(wanted) + 1):
            asked = ["index", *(self._renamed.get(f, f) for f in wanted)]
            t0 = time.monotonic()
            try:
                out = self.run(
                    [f"--query-gpu={','.join(asked)}", "--format=csv,noheader,nounits"],
                    self.timeout,
                )
            except SmiError as e:
                bad = _INVALID.search(str(e))
                if not bad:
                    raise
                self._drop(bad.group(1), wanted)
                continue
            at = (t0 + time.monotonic()) / 2
            return self._rows(out, wanted, len(asked)), at
        raise SmiError("nvidia-smi refused every query field")

    def _drop(self, name: str, wanted: list[str]) -> None:
        new = {v: k for k, v in self._renamed.items()}.get(name, name)
        older = OLDER.get(new)
        if older and new not in self._renamed:
            self._renamed[new] = older
            return
        self.dropped.append(new)
        wanted.remove(new)

    @staticmethod
    def _rows(out: str, wanted: list[str], width: int) -> dict[int, dict[str, str | None]]:
        rows: dict[int, dict[str, str | None]] = {}
        for line in out.splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != width or not cells[0].isdigit():
                continue  # a warning nvidia-smi printed to stdout, not a row
            rows[int(cells[0])] = {f: value(c) for f, c in zip(wanted, cells[1:], strict=True)}
        if not rows:
            raise SmiError(f"no GPU rows in nvidia-smi's answer: {out[:200]!r}")
        return rows

    def mig_instances(self) -> list[GpuInstance]:
        """GPU instances (``mig -lgi``) and compute instances (``mig -lci``) of every GPU."""
        gis = _table(self._mig("-lgi"), _GI)
        cis = _table(self._mig("-lci"), _CI)
        out = [GpuInstance(int(g), p, int(pid), int(gi)) for g, p, pid, gi in gis]
        out += [GpuInstance(int(g), p, int(pid), int(gi), int(ci)) for g, gi, p, pid, ci in cis]
        return out

    def mig_profiles(self) -> dict[tuple[int, str], float]:
        """(GPU index, profile name) -> memory in GiB, from ``mig -lgip``."""
        return {(int(g), p): float(mem) for g, p, mem in _table(self._mig("-lgip"), _GIP)}

    def _mig(self, flag: str) -> str:
        try:
            return self.run(["mig", flag], self.timeout)
        except SmiError as e:
            if "No MIG-enabled devices found" in str(e) or "Not Supported" in str(e):
                return ""
            raise

    def pcie_mbps(self) -> dict[int, tuple[float, float]]:
        """{GPU index: (rx, tx)} PCIe MB/s of one ``dmon -s t`` sample."""
        out = self.run(["dmon", "-s", "t", "-c", "1"], self.timeout)
        got = {}
        for line in out.splitlines():
            cells = line.split()
            if len(cells) >= 3 and cells[0].isdigit():
                try:
                    got[int(cells[0])] = (float(cells[1]), float(cells[2]))
                except ValueError:
                    continue  # "-": not available on this GPU
        return got


_GI = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s*\|", re.M)
_CI = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s*\|", re.M)
_GIP = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+\d+\s+\d+/\d+\s+([\d.]+)\s", re.M)


def _table(text: str, pattern: re.Pattern[str]) -> list[tuple[str, ...]]:
    return [m.groups() for m in pattern.finditer(text)]
