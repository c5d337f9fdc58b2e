"""The exposition package on hand-made snapshots: escaping, families, XID series, the build."""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.catalog.metricsfile import load
from exporter.config.model import default_metrics_file
from exporter.derive.xids import XidCounter
from exporter.exposition import build, text
from exporter.exposition.build import Exposition
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.frame import Holder, Owner
from exporter.nvml.devices import Device
from exporter.nvml.xid.events import XidState
from exporter.snapshot import Snapshot
from tests.support.exposition import Stages, samples

CATALOG = load(default_metrics_file())


def gpu(i: int = 0, host: str = "node", uuid: str = "") -> Device:
    uuid = uuid or f"GPU-{i}"
    labels = (
        ("gpu", str(i)),
        ("UUID", uuid),
        ("pci_bus_id", f"0000:{i:02x}:00.0"),
        ("device", f"nvidia{i}"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", host),
    )
    return Device(uuid, i, uuid, "NVIDIA H100 80GB HBM3", None, labels)


def mig(parent: Device, gi: int, profile: str = "1g.10gb") -> Device:
    labels = (*parent.labels[:5], ("GPU_I_PROFILE", profile), ("GPU_I_ID", str(gi)))
    labels += parent.labels[5:]
    key = f"MIG-{parent.uuid}-{gi}"
    return Device(key, parent.index, parent.uuid, parent.model, None, labels, parent, gi, 0)


def snap(gpus=(), entities=None, down=(), values=None, counts=(), last=()) -> Snapshot:
    vals = {k: MappingProxyType(v) for k, v in (values or {}).items()}
    return Snapshot(
        taken_at=1.0,
        duration=0.1,
        gpus=tuple(gpus),
        entities=tuple(gpus if entities is None else entities),
        down=tuple(down),
        values=MappingProxyType(vals),
        xid=XidState(tuple(counts), tuple(last)),
    )


def dcgm_text(s: Snapshot, holders=None) -> tuple[str, int]:
    b = Stages()
    n = b.publish(s, CATALOG, holders)
    return b.text, n


# --- text ---------------------------------------------------------------------------------


def test_label_values_are_escaped():
    assert text.escape('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert text.join([("pod", 'x"} 1\n'), ("ns", "ok")]) == 'pod="x\\"} 1\\n",ns="ok"'


def test_help_escapes_backslash_and_newline_only():
    assert text.head("m", 'say "hi"\\\nnext', "gauge") == (
        '# HELP m say "hi"\\\\\\nnext\n# TYPE m gauge\n'
    )


@pytest.mark.parametrize(
    ("value", "exported"),
    [
        ("\ud800", "\ufffd"),  # a lone surrogate: what JSON's "\ud800" decodes to
        ("a\udfffb\ud83d", "a\ufffdb\ufffd"),
        ("\ud83d\ude00", "\ufffd\ufffd"),  # a pair left as two code points is two lone ones
        ("\U0001f600 \uffff \u2028 \x00", "\U0001f600 \uffff \u2028 \x00"),  # all valid
    ],
)
def test_code_points_utf8_cannot_encode_are_replaced(value, exported):
    """Every surrogate code point becomes U+FFFD in label values and help texts, so that
    encoding the exposition cannot fail; every other string is kept as it is."""
    assert text.escape(value) == exported
    assert (
        text.head("m", value, "gauge").encode() == f"# HELP m {exported}\n# TYPE m gauge\n".encode()
    )
    assert text.join([("x", value)]).encode() == f'x="{exported}"'.encode()


def test_values_keep_ints_and_round_trip_floats():
    assert text.num(3) == "3"
    assert text.num(0.1) == "0.1"
    assert float(text.num(1 / 3)) == 1 / 3


def test_a_family_without_samples_is_left_out():
    assert text.family("m", "help", "gauge", []) == ""


# --- DCGM families ------------------------------------------------------------------------


def mig_node():
    """GPU 0 in MIG mode with instances GI 3 and GI 5, GPU 1 whole."""
    g, w = gpu(0), gpu(1)
    m3, m5 = mig(g, 3), mig(g, 5, "3g.40gb")
    return snap(
        [g, w],
        entities=[w, m3, m5],
        values={
            g.key: {"DCGM_FI_DEV_GPU_TEMP": 40},
            w.key: {"DCGM_FI_DEV_GPU_TEMP": 41, "DCGM_FI_DEV_FB_USED": 1.5},
            m3.key: {"DCGM_FI_DEV_FB_USED": 2.0},
            m5.key: {"DCGM_FI_DEV_FB_USED": 3.0},
        },
    )


def by_device(s: Snapshot, mode: str | None = None, ids=None, holders=None) -> dict:
    cfg = SimpleNamespace(devices=SimpleNamespace(mode=mode, ids=ids)) if mode else None
    b = Stages(cfg)
    n = b.publish(s, CATALOG, holders)
    got = samples(b.text)
    assert n == len(got)
    return {(x.name, x.labels["gpu"], x.labels.get("GPU_I_ID")): x for x in got}


def test_default_f_repeats_device_fields_per_mig_instance():
    s = mig_node()
    by = {k: x.value for k, x in by_device(s).items()}
    assert by[("DCGM_FI_DEV_GPU_TEMP", "1", None)] == 41
    # the MIG GPU's temperature once per GPU instance, and no parent series
    assert by[("DCGM_FI_DEV_GPU_TEMP", "0", "3")] == by[("DCGM_FI_DEV_GPU_TEMP", "0", "5")] == 40
    assert ("DCGM_FI_DEV_GPU_TEMP", "0", None) not in by
    assert by[("DCGM_FI_DEV_FB_USED", "1", None)] == 1.5
    assert by[("DCGM_FI_DEV_FB_USED", "0", "3")] == 2.0
    assert ("DCGM_FI_DEV_FB_USED", "0", None) not in by  # never on a MIG-enabled parent


def test_device_fields_of_a_mig_instance_carry_its_pod():
    s = mig_node()
    m5 = s.entities[2]
    h = Holder(Owner("ns", "mig-pod", "c"), "", ())
    temp = by_device(s, holders={m5.key: h})
    assert temp[("DCGM_FI_DEV_GPU_TEMP", "0", "5")].labels["pod"] == "mig-pod"
    assert temp[("DCGM_FI_DEV_GPU_TEMP", "0", "5")].labels["GPU_I_PROFILE"] == "3g.40gb"
    assert "pod" not in temp[("DCGM_FI_DEV_GPU_TEMP", "0", "3")].labels


def test_a_mig_gpu_without_instances_keeps_its_own_series():
    g = gpu(0)
    s = snap([g], entities=[], values={g.key: {"DCGM_FI_DEV_GPU_TEMP": 40}})
    assert {k for k in by_device(s) if k[0] == "DCGM_FI_DEV_GPU_TEMP"} == {
        ("DCGM_FI_DEV_GPU_TEMP", "0", None)
    }


def test_g_serves_gpus_only():
    by = by_device(mig_node(), "g")
    assert {k for k in by if k[0] == "DCGM_FI_DEV_GPU_TEMP"} == {
        ("DCGM_FI_DEV_GPU_TEMP", "0", None),
        ("DCGM_FI_DEV_GPU_TEMP", "1", None),
    }
    assert {k for k in by if k[0] == "DCGM_FI_DEV_FB_USED"} == {("DCGM_FI_DEV_FB_USED", "1", None)}
    picked = by_device(mig_node(), "g", frozenset({1}))
    assert {k[1:] for k in picked} == {("1", None)}
    assert ("DCGM_FI_DEV_GPU_TEMP", "1", None) in picked


def test_i_serves_gpu_instances_only():
    by = by_device(mig_node(), "i")
    assert {k[1:] for k in by} == {("0", "3"), ("0", "5")}
    picked = by_device(mig_node(), "i", frozenset({5}))
    assert {k[1:] for k in picked} == {("0", "5")}
    assert picked[("DCGM_FI_DEV_GPU_TEMP", "0", "5")].value == 40


def test_hostile_labels_cannot_forge_series():
    evil = 'x"} 1\nDCGM_FORGED{gpu="0"} 666\n# \\'
    g = gpu(0, host=evil)
    holder = Holder(Owner(evil, evil, evil), evil, (("label_team", evil),))
    body, n = dcgm_text(snap([g], values={g.key: {"DCGM_FI_DEV_GPU_TEMP": 40}}), {g.key: holder})
    parsed = samples(body)
    assert len(parsed) == n and not any(x.name == "DCGM_FORGED" for x in parsed)
    temp = next(x for x in parsed if x.name == "DCGM_FI_DEV_GPU_TEMP")
    assert temp.labels["pod"] == temp.labels["label_team"] == text.escape(evil)


def test_one_holder_adds_pod_labels_in_dcgm_order():
    g = gpu(0)
    h = Holder(Owner("ns", "p", "c"), "uid-1", (("label_app", "a"),))
    body, _ = dcgm_text(snap([g], values={g.key: {"DCGM_FI_DEV_GPU_TEMP": 40}}), {g.key: h})
    line = next(x for x in body.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    tail = line.split('Hostname="node",', 1)[1]
    assert tail == 'pod="p",namespace="ns",container="c",pod_uid="uid-1",label_app="a"} 40'


@pytest.mark.parametrize("mig", [False, True])
def test_a_dra_holder_adds_dcgm_exporters_dra_labels(mig):
    """dcgm-exporter's seven DRA labels (transformation/const.go): the claim, the device's
    driver, pool and name; the MIG profile and MIG UUID only on a MIG device."""
    g = gpu(0)
    extra = ("1g.10gb", "MIG-1") if mig else ()
    o = Owner("ns", "p", "c", "claim", "cns", "gpu.nvidia.com", "node", "gpu-0", *extra)
    body, _ = dcgm_text(snap([g], values={g.key: {"DCGM_FI_DEV_GPU_TEMP": 40}}), {g.key: Holder(o)})
    temp = next(x for x in samples(body) if x.name == "DCGM_FI_DEV_GPU_TEMP")
    dra = {k: v for k, v in temp.labels.items() if k.startswith("dra_")}
    want = {
        "dra_claim_name": "claim",
        "dra_claim_namespace": "cns",
        "dra_driver_name": "gpu.nvidia.com",
        "dra_pool_name": "node",
        "dra_device_name": "gpu-0",
    }
    if mig:
        want |= {"dra_mig_profile": "1g.10gb", "dra_mig_device_uuid": "MIG-1"}
    assert dra == want and "claim_name" not in temp.labels


def test_each_row_of_the_metrics_file_is_one_family(tmp_path: Path):
    """As dcgm-exporter: one family per row, in the file's order, with the row's TYPE and
    HELP; plain fields carry the reading, XID_ERRORS its own samples (last XID, code)."""
    csv = tmp_path / "three.csv"
    csv.write_text(
        "# a comment\n"
        "DCGM_FI_DEV_POWER_USAGE, counter, Power as a counter (odd; the file says so).\n"
        "DCGM_FI_DEV_XID_ERRORS, gauge, Last XID.\n"
        "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (in C).\n"
    )
    g = gpu(0)
    values = {g.key: {"DCGM_FI_DEV_GPU_TEMP": 40, "DCGM_FI_DEV_POWER_USAGE": 99.5}}
    b = Stages()
    assert b.publish(snap([g], values=values, last=[(g.uuid, 13)]), load(csv)) == 3
    fams = list(text_string_to_metric_families(b.text))
    assert [(f.name, f.type, f.documentation) for f in fams] == [
        ("DCGM_FI_DEV_POWER_USAGE", "counter", "Power as a counter (odd; the file says so)."),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Last XID."),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "Temperature (in C)."),
    ]
    assert [s.value for f in fams for s in f.samples] == [99.5, 13, 40]
    assert fams[1].samples[0].labels["err_code"] == "13"


# NVIDIA's Xid catalog: the words by which it names each of these codes.
NVIDIA_XID_NAMES = {
    13: r"graphics engine exception",
    31: r"(mmu|memory page) fault",
    48: r"double.bit ecc",
    79: r"fallen off the bus",
    94: r"contained ecc",
    95: r"uncontained ecc",
    119: r"gsp",
}


def test_last_xid_names_the_code():
    g = gpu(0)
    body, _ = dcgm_text(snap([g]))
    (x,) = [x for x in samples(body) if x.name == "DCGM_FI_DEV_XID_ERRORS"]
    # dcgm-exporter before any XID: 0, "No Error"
    assert (x.value, x.labels["err_code"], x.labels["err_msg"]) == (0, "0", "No Error")
    for code, name in NVIDIA_XID_NAMES.items():
        body, _ = dcgm_text(snap([g], last=[(g.uuid, code)]))
        (x,) = [x for x in samples(body) if x.name == "DCGM_FI_DEV_XID_ERRORS"]
        assert (x.value, x.labels["err_code"]) == (code, str(code))
        assert re.search(name, x.labels["err_msg"], re.IGNORECASE), (code, x.labels["err_msg"])
    body, _ = dcgm_text(snap([g], last=[(g.uuid, 100000)]))
    (x,) = [x for x in samples(body) if x.name == "DCGM_FI_DEV_XID_ERRORS"]
    assert (x.value, x.labels["err_msg"]) == (100000, "Unknown XID")


# --- XID counter --------------------------------------------------------------------------


def xid_rows(counter: XidCounter, s: Snapshot, holders=None):
    return [(x.device.key, x.xid, x.count) for x in counter.update(s, holders)]


def test_xid_count_survives_a_label_change():
    """A relabelled GPU (here: its hostname label) keeps its count under the new labels."""
    c = XidCounter()
    assert xid_rows(c, snap([gpu(0)], counts=[("GPU-0", None, None, 13, 2)])) == [("GPU-0", 13, 2)]
    renamed = gpu(0, host="other")
    series = c.update(snap([renamed], counts=[("GPU-0", None, None, 13, 3)]))
    assert [(s.count, s.device.labels[-1]) for s in series] == [(3, ("Hostname", "other"))]


def test_xid_count_survives_a_pod_label_change():
    g = gpu(0)
    c = XidCounter()
    before = {g.key: Holder(Owner("ns", "p", "c"), "", (("label_v", "1"),))}
    after = {g.key: Holder(Owner("ns", "p", "c"), "", (("label_v", "2"),))}
    c.update(snap([g], counts=[(g.uuid, None, None, 13, 1)]), before)
    series = c.update(snap([g], counts=[(g.uuid, None, None, 13, 2)]), after)
    assert [(s.count, s.holder) for s in series] == [(2, after[g.key])]


def test_xid_counts_continue_when_the_watcher_starts_over():
    g = gpu(0)
    c = XidCounter()
    c.update(snap([g], counts=[(g.uuid, None, None, 31, 5)]))
    assert xid_rows(c, snap([g], counts=[(g.uuid, None, None, 31, 2)])) == [(g.key, 31, 7)]


def test_xid_series_of_a_gone_mig_instance_keep_their_labels():
    g = gpu(0)
    m = mig(g, 3, "3g.40gb")
    c = XidCounter()
    c.update(snap([g], entities=[m], counts=[(g.uuid, 3, 0, 43, 1)]))
    series = c.update(snap([g], entities=[g], counts=[(g.uuid, 3, 0, 43, 1)]))
    assert [(s.device.key, s.count) for s in series] == [(m.key, 1)]
    assert ("GPU_I_PROFILE", "3g.40gb") in series[0].device.labels


# --- build --------------------------------------------------------------------------------


def test_exposition_gzip_holds_the_same_bytes():
    e = Exposition.of("a 1\n")
    assert gzip.decompress(e.gzipped) == e.plain == b"a 1\n"
    assert Exposition.of("a 1\n").gzipped == e.gzipped  # no timestamp in the header


def test_exposition_gzip_of_a_whole_node():
    body = (Path(__file__).parents[1] / "golden" / "mixed-node.prom").read_text()
    e = Exposition.of(body)
    assert gzip.decompress(e.gzipped) == body.encode()
    assert e.gzipped[:4] == b"\x1f\x8b\x08\x00"  # gzip, deflate, no file name
    assert e.gzipped[4:8] == bytes(4)  # no timestamp
    assert len(e.gzipped) < len(body) / 10


def test_exposition_gzip_uses_isal_where_installed():
    isal_zlib = pytest.importorskip("isal.isal_zlib", reason="isal not installed: pip install -e .")
    assert build._COMPRESS is isal_zlib.compress


def test_build_serves_dcgm_then_self_metrics():
    g = gpu(0)
    sm = SelfMetrics(15.0)
    b = Stages(selfmetrics=sm)
    sm.series = b.publish(snap([g], values={g.key: {"DCGM_FI_DEV_GPU_TEMP": 40}}), CATALOG)
    body = b.builder.build().plain.decode()
    assert body.startswith(b.text)
    names = [x.name for x in samples(body)]
    assert names.index("DCGM_FI_DEV_GPU_TEMP") < names.index("gpu_exporter_series")
    series = next(x for x in samples(body) if x.name == "gpu_exporter_series")
    assert series.value == len(samples(b.text))


def test_a_catalog_reload_changes_the_families(tmp_path: Path):
    small = tmp_path / "small.csv"
    small.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n")
    g = gpu(0)
    s = snap([g], values={g.key: {"DCGM_FI_DEV_GPU_TEMP": 40, "DCGM_FI_DEV_POWER_USAGE": 99.5}})
    b = Stages()
    assert b.publish(s, load(small)) == 1
    assert [x.name for x in samples(b.text)] == ["DCGM_FI_DEV_POWER_USAGE"]


def test_only_the_exposition_package_writes_metric_text():
    """HELP/TYPE lines, label escaping and exposition formatters live in exporter/exposition/."""
    root = Path(__file__).parents[2] / "exporter"
    markers = ("# HELP", "# TYPE", "generate_latest", '\\\\"')
    offenders = [
        f"{path.relative_to(root)}: {marker}"
        for path in root.rglob("*.py")
        if "exposition" not in path.parts
        for marker in markers
        if marker in path.read_text()
    ]
    assert offenders == []


def test_device_ids_that_match_nothing_are_logged_once(caplog: pytest.LogCaptureFixture):
    cfg = SimpleNamespace(devices=SimpleNamespace(mode="g", ids=frozenset({1, 9})))
    b = Stages(cfg)
    for _ in range(3):
        b.publish(mig_node(), CATALOG)
    lines = [r.getMessage() for r in caplog.records if "-d/--devices" in r.getMessage()]
    assert len(lines) == 1 and "GPU index 9 " in lines[0]
    assert {x.labels["gpu"] for x in samples(b.text)} == {"1"}


# --- across cycles: text kept from the last cycle only while nothing it shows changed -----


def test_consecutive_cycles_show_changed_values_holders_and_devices():
    g0, g1 = gpu(0), gpu(1)
    b = Stages()

    def cycle(gpus, temps, holders=None) -> dict[tuple[str, str], tuple[float, str | None]]:
        values = {
            g.key: {"DCGM_FI_DEV_GPU_TEMP": t, "DCGM_FI_DEV_SM_CLOCK": 1980} for g, t in temps
        }
        b.publish(snap(gpus, values=values), CATALOG, holders)
        return {
            (x.name, x.labels["gpu"]): (x.value, x.labels.get("pod"))
            for x in samples(b.text)
            if x.name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK")
        }

    temp, clock = "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK"
    assert cycle([g0, g1], [(g0, 40), (g1, 41)])[(temp, "1")] == (41, None)
    got = cycle([g0, g1], [(g0, 40), (g1, 45)])  # one value moved, the clocks did not
    assert got[(temp, "0")] == (40, None) and got[(temp, "1")] == (45, None)
    assert got[(clock, "1")] == (1980, None)
    held = {g1.key: Holder(Owner("ns", "p", "c"))}
    got = cycle([g0, g1], [(g0, 40), (g1, 45)], held)  # same values, a pod arrived
    assert got[(clock, "1")] == (1980, "p") and got[(clock, "0")] == (1980, None)
    got = cycle([g0, g1], [(g0, 40), (g1, 45)], {g1.key: Holder(Owner("ns", "q", "c"))})
    assert got[(temp, "1")] == (45, "q")
    got = cycle([g0], [(g0, 40)])  # GPU 1 gone, its pod with it
    assert set(got) == {(temp, "0"), (clock, "0")}
    got = cycle([g0, g1], [(g0, 40)])  # back, without readings: no series yet
    assert set(got) == {(temp, "0"), (clock, "0")}


def test_kept_family_text_follows_type_sign_and_nan_of_each_reading():
    # each pair of neighbours compares equal (or is a NaN) but must be written apart
    g0, g1 = gpu(0), gpu(1)
    b = Stages()
    nan = float("nan")
    power = "DCGM_FI_DEV_POWER_USAGE"
    for v in (0, 0.0, -0.0, 0.0, False, 1, 1.0, 2**53, float(2**53), nan, nan, 5):
        values = {g0.key: {power: v}, g1.key: {power: 7.5}}
        b.publish(snap([g0, g1], values=values), CATALOG)
        got = [line for line in b.text.splitlines() if line.startswith(power + "{")]
        assert got[0].endswith(f" {text.num(v)}") and got[1].endswith(" 7.5"), (v, got)


def test_a_gpu_reading_that_moves_shows_on_its_mig_instances_only():
    g0, g1 = gpu(0), gpu(1)
    m = [mig(g0, 3), mig(g0, 5), mig(g1, 1), mig(g1, 2)]
    b = Stages()
    for t0, t1 in ((40, 50), (40, 51), (41, 51), (41, 51)):
        temps = {g0.key: {"DCGM_FI_DEV_GPU_TEMP": t0}, g1.key: {"DCGM_FI_DEV_GPU_TEMP": t1}}
        b.publish(snap([g0, g1], entities=m, values=temps), CATALOG)
        got = {
            (x.labels["gpu"], x.labels["GPU_I_ID"]): x.value
            for x in samples(b.text)
            if x.name == "DCGM_FI_DEV_GPU_TEMP"
        }
        assert got == {("0", "3"): t0, ("0", "5"): t0, ("1", "1"): t1, ("1", "2"): t1}


def test_xid_family_follows_last_xid_holders_and_layout_across_cycles():
    g0, g1 = gpu(0), gpu(1)
    b = Stages()
    temps = {g.key: {"DCGM_FI_DEV_GPU_TEMP": 40} for g in (g0, g1)}

    def cycle(gpus, last=(), holders=None, values=temps) -> dict[str, tuple[float, str | None]]:
        b.publish(snap(gpus, values=values, last=last), CATALOG, holders)
        return {
            x.labels["gpu"]: (x.value, x.labels.get("pod"))
            for x in samples(b.text)
            if x.name == "DCGM_FI_DEV_XID_ERRORS"
        }

    assert cycle([g0, g1]) == {"0": (0, None), "1": (0, None)}
    assert cycle([g0, g1]) == {"0": (0, None), "1": (0, None)}
    assert cycle([g0, g1], ((g1.key, 79),)) == {"0": (0, None), "1": (79, None)}
    held = {g1.key: Holder(Owner("ns", "p", "c"))}
    assert cycle([g0, g1], ((g1.key, 79),), held) == {"0": (0, None), "1": (79, "p")}
    # GPU 1 without readings: its pod leaves while the series with readings stay alike
    only0 = {g0.key: temps[g0.key]}
    assert cycle([g0, g1], ((g1.key, 79),), held, only0)["1"] == (79, "p")
    assert cycle([g0, g1], ((g1.key, 79),), None, only0)["1"] == (79, None)
    assert cycle([g0], ((g1.key, 79),)) == {"0": (0, None)}
    assert cycle([g0, g1], ((g1.key, 79),)) == {"0": (0, None), "1": (79, None)}
