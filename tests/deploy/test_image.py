"""The container image: built from the Dockerfile with buildah, run with --simulate, scraped from
the host; then run again on a read-only root as the image's own user.

No registry is reachable here, so the base image (BASE_IMAGE) is made locally: Debian
bookworm minbase with python3 and python3-venv, from debootstrap. It is kept in the local
image store as BASE and reused by later runs (delete it to rebuild it). The host's CA bundle
and a pip.conf naming it go into that base, so that pip in the build reaches PyPI through
whatever TLS proxy the host trusts; nothing of it is in the Dockerfile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from exporter import __version__
from tests.procs import ROOT, free_port, http_get, wait_until

pytestmark = pytest.mark.image

BASE = "localhost/gpu-exporter-base:bookworm-1"
IMAGE = "localhost/gpu-exporter:test"
TRIM = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
)
# Budgets above the sizes measured at 0.1.0 (docs/benchmarks.md, "Image": 154.3 MB on a
# 127.8 MB debootstrap base), to catch growth: the whole image (a python:3.x-slim base is
# of the same order), and what the Dockerfile adds to the base: the virtual environment
# (aiohttp, PyYAML, protobuf, h2, prometheus-client, bcrypt, isal, nvidia-ml-py and the
# exporter, 26.5 MB), with room for a dependency's own growth but not for a new large one.
MAX_IMAGE_MB = 170
MAX_ADDED_MB = 40


def _run(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{' '.join(args)}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _tools() -> dict[str, str]:
    found = {t: shutil.which(t) for t in ("buildah", "podman", "debootstrap", "unshare", "chroot")}
    missing = [t for t, path in found.items() if path is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: "
            "apt-get install buildah podman debootstrap (.ci/run does)"
        )
    return found  # type: ignore[return-value]


def _exists(image: str) -> bool:
    return (
        subprocess.run(
            ["buildah", "inspect", "--type", "image", image], capture_output=True
        ).returncode
        == 0
    )


def _size_mb(image: str) -> float:
    out = _run("podman", "image", "inspect", "--format", "{{.Size}}", image).stdout
    return int(out.strip()) / 1e6


def _make_base() -> None:
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-base-") as tmp:
        root = Path(tmp) / "root"
        _run(
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv",
            "bookworm",
            str(root),
            os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian"),
            timeout=900,
        )
        for sub in TRIM:
            for p in (root / sub).glob("*"):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        bundle = Path("/etc/ssl/certs/ca-certificates.crt")
        if bundle.is_file():
            shutil.copy(bundle, root / "etc/ssl/certs/ca-certificates.crt")
            (root / "etc/pip.conf").write_text(f"[global]\ncert = {bundle}\n")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        _run("podman", "import", "-", BASE, stdin=tar.stdout, timeout=300)
        tar.wait()


@pytest.fixture(scope="module")
def image():
    """Build the image; yields (build seconds, image config)."""
    _tools()
    if not _exists(BASE):
        _make_base()
    start = time.monotonic()
    _run(
        "buildah", "build", "--isolation", "chroot", "--layers", "--force-rm",
        "--build-arg", f"BASE_IMAGE={BASE}",
        "--build-arg", f"VERSION={__version__}",
        "-t", IMAGE, str(ROOT),
        timeout=1200,
    )  # fmt: skip
    took = time.monotonic() - start
    info = json.loads(_run("buildah", "inspect", "--type", "image", IMAGE).stdout)
    print(
        f"\nimage {IMAGE}: {_size_mb(IMAGE):.1f} MB "
        f"(base {_size_mb(BASE):.1f} MB), built in {took:.0f} s"
    )
    return took, info["OCIv1"]["config"]


@pytest.fixture
def container(image):
    name = f"gpu-exporter-test-{os.getpid()}-{time.monotonic_ns()}"
    _run("buildah", "from", "--name", name, IMAGE)
    yield name
    subprocess.run(["buildah", "umount", name], capture_output=True)
    subprocess.run(["buildah", "rm", name], capture_output=True)


def test_image_config(image):
    _, config = image
    assert config["Entrypoint"] == ["gpu-exporter"]
    assert config["User"] == "65532:65532"
    assert "9400/tcp" in config["ExposedPorts"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.base.name"] == BASE
    for key in ("title", "description", "source", "licenses", "revision", "created"):
        assert labels[f"org.opencontainers.image.{key}"], key


def test_image_is_small_and_has_no_build_tools(image, container):
    size, base = _size_mb(IMAGE), _size_mb(BASE)
    assert size < MAX_IMAGE_MB and size - base < MAX_ADDED_MB, (size, base)
    check = (
        "for t in gcc cc c++ make ld pip pip3; do command -v $t && exit 1; done; "
        "test ! -e /opt/gpu-exporter/bin/pip && test ! -e /root/.cache/pip && "
        "test -z \"$(find / -xdev -name '*.whl' -path '*cache*' 2>/dev/null)\""
    )
    _run(
        "buildah",
        "run",
        "--isolation",
        "chroot",
        "--user",
        "0:0",
        container,
        "--",
        "sh",
        "-c",
        check,
    )


def _scrape(port: int, proc: subprocess.Popen) -> str:
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}"
            )
        return http_get(f"http://127.0.0.1:{port}/ready")[0] == 200

    wait_until(ready, 60, "the exporter in the container to be ready", interval=0.2)
    status, headers, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    return body.decode()


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_runs_with_simulate_and_is_scraped_from_the_host(container):
    """buildah run with chroot isolation shares the host's network."""
    port = free_port()
    proc = subprocess.Popen(
        ["buildah", "run", "--isolation", "chroot", "-e", "NODE_NAME=image-node", container, "--",
         "gpu-exporter", "--simulate", "-k", "-c", "500", "-a", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        text = _scrape(port, proc)
    finally:
        log = _stop(proc)
    assert 'hostname="image-node"' in text  # dcgm-exporter 4.8.4's label, the default
    # -k: the simulator's own kubelet on the image's runtime dependencies (h2, protobuf)
    assert 'pod="train-0",namespace="ml",container="trainer"' in text
    # -d f: 6 whole GPUs and the 11 MIG instances of the 2 MIG GPUs
    assert text.count("DCGM_FI_DEV_GPU_TEMP{") == 17
    assert "gpu_exporter_build_info{" in text
    assert "Traceback" not in log


def test_runs_on_a_read_only_root_as_the_images_user(image, container):
    """What the DaemonSet asks for: readOnlyRootFilesystem, and no writable /tmp either."""
    _, config = image
    root = _run("buildah", "mount", container).stdout.strip()
    port = free_port()
    at = tempfile.mkdtemp(prefix="gpu-exporter-ro-")
    script = (
        'set -e; r="$1"; m="$2"; shift 2; '
        'mount --rbind "$r" "$m"; mount -o remount,bind,ro "$m"; mount -t proc proc "$m/proc"; '
        'exec chroot --userspec="$USERSPEC" "$m" "$@"'
    )
    env_args = [
        "/usr/bin/env",
        "-i",
        f"PATH={_path(config)}",
        "NODE_NAME=ro-node",
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", root, at,
         *env_args, "sh", "-c", 'touch /opt/probe 2>/dev/null && echo WRITABLE; exec "$0" "$@"',
         "gpu-exporter", "--simulate", "-c", "500", "-a", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "USERSPEC": config["User"]},
    )  # fmt: skip
    try:
        text = _scrape(port, proc)
    finally:
        log = _stop(proc)
        os.rmdir(at)
    assert 'hostname="ro-node"' in text
    assert "WRITABLE" not in log and "Traceback" not in log


def _path(config) -> str:
    return dict(e.split("=", 1) for e in config["Env"])["PATH"]
