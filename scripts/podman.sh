# Sourced by the scripts that build or run containers (image.sh, and through
# the tests' harness, make deploy-smoke and make chart-smoke): installs podman
# with apt-get when missing, points it at docker/podman-containers.conf, and
# says which base image the Dockerfile builds on.
#
#   . scripts/podman.sh; podman_ready; base=$(python_base_image)

TXLOG_ROOT=${TXLOG_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$TXLOG_ROOT/docker/podman-containers.conf}
REGISTRY_PYTHON_IMAGE=${REGISTRY_PYTHON_IMAGE:-python:3.11-slim-bookworm}
REGISTRY_DEBIAN_IMAGE=${REGISTRY_DEBIAN_IMAGE:-debian:bookworm-slim}
LOCAL_BASE_IMAGE=localhost/debian:bookworm

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

podman_ready() {
  local need=()
  for tool in podman runc newuidmap slirp4netns fuse-overlayfs mmdebstrap; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
  done
  if [ ${#need[@]} -gt 0 ]; then
    local packages=()
    for tool in "${need[@]}"; do
      case $tool in newuidmap) packages+=(uidmap) ;; *) packages+=("$tool") ;; esac
    done
    echo "podman: apt-get install ${packages[*]}" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${packages[@]}" >/dev/null
  fi
}

# $1 from a registry when one answers within a minute, else the
# Debian-packages base (built once by debian_base_image; podman keeps it).
base_image() {
  if podman image exists "$1" || timeout 60 podman pull -q "$1" >/dev/null 2>&1; then
    echo "$1"
  else
    debian_base_image
    echo "$LOCAL_BASE_IMAGE"
  fi
}

python_base_image() {
  if [ -n "${TXLOG_PYTHON_IMAGE:-}" ]; then echo "$TXLOG_PYTHON_IMAGE"; else base_image "$REGISTRY_PYTHON_IMAGE"; fi
}

# Debian bookworm from its packages (mmdebstrap, about 25 s): python3 3.11 with
# venv, `python` for the Dockerfile's commands, CA certificates. Built once.
debian_base_image() {
  podman image exists "$LOCAL_BASE_IMAGE" && return 0
  local scratch
  scratch=$(mktemp -d)
  echo "podman: building $LOCAL_BASE_IMAGE from Debian packages (no registry base reachable)" >&2
  as_root mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$scratch/rootfs.tar" >&2
  podman import --quiet "$scratch/rootfs.tar" "$LOCAL_BASE_IMAGE" >/dev/null
  rm -rf "$scratch"
}
