"""The attack soak in CI: one minute of the mix of attacks of tests/reliability/attacks.py
against the real exporter (TLS, basic auth, a fake kubelet and API server, XIDs and a
driver outage from the fleet file), two rounds, with a legitimate scraper every second.
The 10-minute run and its figures are in docs/reliability.md."""

from __future__ import annotations

from tests.reliability.attack_report import summary, verdict
from tests.reliability.attack_soak import soak


def test_attack_soak_one_minute():
    s = summary(soak(60))
    print(f"\nattack soak: { {k: v for k, v in s.items() if k != 'attacks'} }")
    assert verdict(s) == [], s
    # the mix really ran: every attack had its two turns, and each did something
    for attack in ("tls_handshake_flood", "header_flood", "never_reading", "wrong_passwords",
                   "sighup_storm", "hostile_kubelet", "oversized_labels"):  # fmt: skip
        assert s["attacks"][f"{attack}_phases"] == 2, s["attacks"]
    assert s["attacks"]["http_431"] > 0
    assert s["attacks"]["wrong_passwords_refused"] > 0
    assert s["xid_expected"] > 0
    assert s["scrapes_during_outages"] > 0  # the driver outage happened while scraped
