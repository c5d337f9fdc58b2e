"""The attack soak in CI: two minutes of the mix of attacks of tests/reliability/attacks.py
against the real exporter (TLS, basic auth, a fake kubelet and API server, XIDs and
refused driver unloads from the fleet file), two rounds, with a legitimate scraper every
second.
The 10-minute run and its figures are in docs/reliability.md."""

from __future__ import annotations

import json
from typing import Any

from tests.reliability.attack_report import summary, verdict
from tests.reliability.attack_soak import soak


def xid_story(record: dict[str, Any]) -> str:
    """What a failed run says about XIDs: each change of a counted total by scrape time,
    and the exporter's XID and NVML log lines (to tell a lost event from a late one)."""
    changes, last = [], {}
    for sc in record["scrapes"]:
        for key, n in sc["xids"].items():
            if last.get(key) != n:
                changes.append(f"{sc['t']:.1f}s {key}={n}")
                last[key] = n
    lines = [x for x in record["log"].splitlines() if "XID" in x or "NVML" in x]
    return "XID totals: " + ", ".join(changes) + "\n" + "\n".join(lines[-40:])


def test_attack_soak_two_minutes(tmp_path):
    # two rounds of 8 s turns: with 4 s turns (one minute), what an attack left behind
    # was still being processed at the quiet sample, and RSS "growth" was timing noise
    record = soak(120)
    s = summary(record)
    print(f"\nattack soak: { {k: v for k, v in s.items() if k != 'attacks'} }")
    if verdict(s):
        (tmp_path / "attack-soak.json").write_text(json.dumps(record, indent=1))
    assert verdict(s) == [], f"{s}\n{xid_story(record) if s['xid_mismatch'] else ''}"
    # the mix really ran: every attack had its two turns, and each did something
    for attack in ("tls_handshake_flood", "header_flood", "never_reading", "wrong_passwords",
                   "sighup_storm", "hostile_kubelet", "oversized_labels"):  # fmt: skip
        assert s["attacks"][f"{attack}_phases"] == 2, s["attacks"]
    assert s["attacks"]["http_431"] > 0
    assert s["attacks"]["wrong_passwords_refused"] > 0
    assert s["xid_expected"] > 0
