# gpu-exporter container image.
#
#   buildah build --isolation chroot -t gpu-exporter:0.1.0 .     (or: docker build -t ... .)
#
# BASE_IMAGE is any Debian-like image with python3 (3.11 or newer) and its venv module;
# both stages must use the same one, because the virtual environment copied into the
# final stage points at the base image's interpreter. tests/deploy/test_image.py builds
# on a base made locally with debootstrap (bookworm, minbase, python3 + python3-venv).
#
# The image carries no NVIDIA library: the NVIDIA container runtime mounts
# libnvidia-ml.so.1 and the /dev/nvidia* device files when the container starts with
# NVIDIA_VISIBLE_DEVICES set (the default below: all GPUs) and the "utility" driver
# capability, which is the capability that includes NVML. See docs/deploy.md.
ARG BASE_IMAGE=docker.io/library/python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
RUN python3 -m venv /opt/gpu-exporter
# Dependencies get their own layer, rebuilt only when pyproject.toml changes. Wheels only:
# the image has no compiler, so a dependency without a wheel must fail here, loudly.
COPY pyproject.toml ./
# The kube extra (h2 with hpack and hyperframe, pure Python; protobuf) is installed too: the
# image serves -k.
RUN python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["kube"]))' \
        > /tmp/requirements.txt \
 && /opt/gpu-exporter/bin/pip install --only-binary=:all: -r /tmp/requirements.txt
COPY README.md ./
COPY exporter ./exporter
# pip compiles the .pyc files at install time, so nothing is written at run time (read-only
# root). pip itself is not needed to run and leaves with the build stage's other tools.
RUN /opt/gpu-exporter/bin/pip install --no-deps . \
 && /opt/gpu-exporter/bin/pip uninstall -q -y pip setuptools \
 && /opt/gpu-exporter/bin/gpu-exporter --simulate --check \
 && /opt/gpu-exporter/bin/python -c "import exporter.workloads.apiserver.watch, exporter.workloads.kubelet.podresources, exporter.sim.kubelet"

FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="gpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs and MIG instances over NVML, with dcgm-exporter's metric names" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/your-org/gpu-exporter" \
      org.opencontainers.image.documentation="https://github.com/your-org/gpu-exporter/blob/main/docs/deploy.md" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
COPY --from=build /opt/gpu-exporter /opt/gpu-exporter
ENV PATH=/opt/gpu-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# A numeric uid with no entry in /etc/passwd, above the login range and not "nobody", so it
# owns nothing on the host. NVML only needs the device files, which the NVIDIA driver
# creates world-readable and -writable (mode 0666) by default. The Kubernetes manifests
# run as uid 0 with every capability dropped instead, because the kubelet's pod-resources
# socket is root's (docs/deploy.md).
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["gpu-exporter"]
