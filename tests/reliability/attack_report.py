"""Figures and verdict of an attack soak record (tests/reliability/attack_soak.py)."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from exporter.http.listener import ACCEPT_HEADROOM
from exporter.http.webconfig.auth import WORKERS

MAX_CONNECTIONS = 64  # the soak's --max-connections

RSS_MIB = 96  # issue 12's bound; see RSS_ATTACK_MIB
# most the attacks may add over the idle exporter (the first sample): 10 minutes of the
# mix peaked at 70 MiB over it (TLS handshake buffers of a flood, 5,000-label pod events),
# then fell back; RSS_GROWTH_MIB is what says it does not creep
RSS_ATTACK_MIB = 80
# fds: the listener stops accepting while cap + ACCEPT_HEADROOM sockets are held
# (those still closing included), so no more are open at any moment
FDS_OVER_BASE = MAX_CONNECTIONS + ACCEPT_HEADROOM + 10
# threads: the only pools that grow (lazily, to a fixed size) are bcrypt's and
# asyncio's default executor (web config and metrics file reads)
THREADS_OVER_BASE = WORKERS + min(32, (os.cpu_count() or 1) + 4)
RSS_GROWTH_MIB = 8.0  # last quiet sample over the one after the first round
LATENCY_S = 1.0
STALE_S = 5.0  # the collection's age at a scrape, outside driver outages
LOG_LINES_PER_MINUTE = 40
QUANTILES = (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
RECOVERY_S = 25.0  # after an outage starts: its 3 s, the backoff, the sim clock's lag


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0


RELOADS = ("exporter.runtime.signals", "exporter.app", "exporter.http.webconfig.state")


def _log_per_minute(lines: list[list[str]], reloads: bool) -> int:
    """The most log lines in one clock minute: of config reloads, or of everything else."""
    per = Counter(minute for minute, source in lines if (source in RELOADS) == reloads)
    return max(per.values(), default=0)


def _longest_failure(scrapes: list[dict[str, Any]]) -> int:
    run = most = 0
    for s in scrapes:
        run = run + 1 if s["status"] != 200 or s["seconds"] >= LATENCY_S else 0
        most = max(most, run)
    return most


def _xids_decreased(scrapes: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for s in scrapes:
        for key, n in s["xids"].items():
            if n < seen.get(key, 0):
                out.append(f"{key} {seen[key]} -> {n} at {s['t']:.0f} s")
            seen[key] = n
    return out


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run."""
    scrapes, procs = r["scrapes"], r["procs"]
    ok = [s for s in scrapes if s["status"] == 200]
    lat = [s["seconds"] for s in scrapes]

    def outage(t: float) -> bool:
        return any(o <= t <= o + RECOVERY_S for o in r["outages"])

    calm = [s for s in ok if s["nvml_up"] == 1 or not outage(s["t"])]
    quiet = [p for p in procs if p["quiet"]]
    warm = quiet[1] if len(quiet) > 2 else quiet[0]
    loud = [p for p in procs if not p["quiet"]]
    half = len(loud) // 2
    return {
        "seconds": r["seconds"],
        "alive": r["alive"],
        "scrapes": len(scrapes),
        "scrapes_failed": len(scrapes) - len(ok),
        "scrapes_over_1s": sum(x >= LATENCY_S for x in lat),
        "scrapes_failed_in_a_row": _longest_failure(scrapes),
        "latency_ms": {k: round(_pct(lat, q) * 1000, 1) for k, q in QUANTILES},
        "scrapes_missing_devices": sum(s["devices"] != r["entities"] for s in calm),
        "scrapes_missing_pod_labels": sum(not s["pod_labels"] for s in calm),
        "scrapes_during_outages": len(ok) - len(calm),
        "max_collection_age_s": max((s["age"] for s in calm), default=-1),
        "xid_expected": sum(r["xid_expected"].values()),
        "xid_counted": sum(ok[-1]["xids"].values()) if ok else 0,
        "xid_mismatch": {
            k: (n, ok[-1]["xids"].get(k, 0) if ok else 0)
            for k, n in r["xid_expected"].items()
            if not ok or ok[-1]["xids"].get(k, 0) != n
        },
        "xid_decreases": _xids_decreased(ok),
        "rss_mib_start": round(procs[0]["rss_mib"], 1),
        "rss_mib_after_round_1": round(warm["rss_mib"], 1),
        "rss_mib_end": round(quiet[-1]["rss_mib"], 1),
        "rss_mib_max": round(max(p["rss_mib"] for p in procs), 1),
        "rss_growth_mib": round(quiet[-1]["rss_mib"] - warm["rss_mib"], 2),
        "fds_quiet": [p["fds"] for p in quiet],
        "fds_max": max(p["fds"] for p in procs),
        "threads_quiet": [p["threads"] for p in quiet],
        "threads_halves_max": [
            max((p["threads"] for p in loud[:half]), default=0),
            max((p["threads"] for p in loud[half:]), default=0),
        ],
        "log_lines": procs[-1]["log_lines"] - procs[0]["log_lines"],
        "log_lines_max_per_minute": _log_per_minute(r["log_minutes"], reloads=False),
        "reload_lines_max_per_minute": _log_per_minute(r["log_minutes"], reloads=True),
        "tracebacks": r["tracebacks"],
        "attacks": r["attacks"],
    }


def verdict(s: dict[str, Any]) -> list[str]:
    """What went wrong, one line each; empty when the run held."""
    checks = [
        (s["alive"], "the exporter died"),
        # a flood of new sockets may close the scraper's (the oldest) in its handshake, or
        # hold it past 1 s; the next scrape, a second later, must get through in time
        (s["scrapes_failed_in_a_row"] <= 1, f"{s['scrapes_failed_in_a_row']} failed in a row"),
        (s["latency_ms"]["p99"] < LATENCY_S * 1000, f"slow scrapes: {s['latency_ms']}"),
        (s["scrapes_missing_devices"] == 0, f"{s['scrapes_missing_devices']} lacked devices"),
        (s["scrapes_missing_pod_labels"] == 0, f"{s['scrapes_missing_pod_labels']} lacked pods"),
        (0 <= s["max_collection_age_s"] < STALE_S, f"stale: {s['max_collection_age_s']} s"),
        (not s["xid_mismatch"], f"XIDs (expected, counted): {s['xid_mismatch']}"),
        (not s["xid_decreases"], f"XID counts went down: {s['xid_decreases'][:3]}"),
        (
            s["rss_mib_max"] - s["rss_mib_start"] < RSS_ATTACK_MIB,
            f"RSS {s['rss_mib_start']} -> {s['rss_mib_max']} MiB",
        ),
        (s["rss_growth_mib"] < RSS_GROWTH_MIB, f"RSS grew {s['rss_growth_mib']} MiB"),
        (s["fds_quiet"][-1] <= s["fds_quiet"][1], f"fds grew: {s['fds_quiet']}"),
        (s["fds_max"] <= s["fds_quiet"][0] + FDS_OVER_BASE, f"fds: {s['fds_max']}"),
        (
            max(s["threads_halves_max"]) <= s["threads_quiet"][0] + THREADS_OVER_BASE,
            f"threads: {s['threads_quiet']}, {s['threads_halves_max']}",
        ),
        (
            s["log_lines_max_per_minute"] <= LOG_LINES_PER_MINUTE,
            f"{s['log_lines_max_per_minute']} log lines in a minute",
        ),
        (s["tracebacks"] == 0, f"{s['tracebacks']} tracebacks"),
    ]
    return [why for held, why in checks if not held]


def write_doc(s: dict[str, Any], doc: Path) -> None:
    """Replace the block between the attack-soak markers in docs/reliability.md."""
    lat, a = s["latency_ms"], s["attacks"]
    rows = [
        ("run", f"{s['seconds']:.0f} s, {s['scrapes']} legitimate scrapes"),
        ("scrape latency", f"median {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms"),
        ("scrapes failed, over 1 s", f"{s['scrapes_failed']}, {s['scrapes_over_1s']} "
         "(never two in a row)"),
        ("scrapes lacking a healthy device or its pod",
         f"{s['scrapes_missing_devices']} / {s['scrapes_missing_pod_labels']} "
         f"(outside the outages; {s['scrapes_during_outages']} scrapes during them)"),
        ("oldest collection at a scrape", f"{s['max_collection_age_s']} s"),
        ("XID events", f"{s['xid_expected']} injected, {s['xid_counted']} counted"),
        ("RSS", f"{s['rss_mib_start']} MiB at the start, {s['rss_mib_after_round_1']} after the "
         f"first round, {s['rss_mib_end']} at the end (max {s['rss_mib_max']})"),
        ("open fds, quiet", ", ".join(map(str, s["fds_quiet"])) + f" (max {s['fds_max']})"),
        ("threads, quiet", ", ".join(map(str, s["threads_quiet"]))),
        ("log", f"{s['log_lines']} lines; in a minute at most {s['log_lines_max_per_minute']}, "
         f"besides {s['reload_lines_max_per_minute']} of config reloads; "
         f"{s['tracebacks']} tracebacks"),
        ("attacks", f"{a.get('tls_half_handshakes', 0):,} half TLS handshakes, "
         f"{a.get('header_flood_clients', 0):,} header-flood clients "
         f"({a.get('http_431', 0)} answered 431), "
         f"{a.get('never_reading_clients', 0):,} never-reading clients, "
         f"{a.get('wrong_passwords_refused', 0):,} wrong passwords refused, "
         f"{a.get('sighups', 0):,} SIGHUPs, {a.get('watch_events', 0):,} watch events"),
    ]  # fmt: skip
    table = "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    text = doc.read_text()
    block = f"<!-- attack-soak:begin -->\n{table}<!-- attack-soak:end -->"
    pattern = r"<!-- attack-soak:begin -->.*?<!-- attack-soak:end -->"
    new, n = re.subn(pattern, block, text, flags=re.S)
    if n != 1:
        raise SystemExit(f"{doc}: no attack-soak markers to write between")
    doc.write_text(new)
