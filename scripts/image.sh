#!/usr/bin/env bash
# make image: localhost/txlog:dev (the three services: Dockerfile target
# `service`, no Java, no PySpark), localhost/txlog-spark:dev (the Spark jobs:
# target `spark`) and localhost/txlog-zookeeper:dev (docker/zookeeper, for the
# compose stack where Docker Hub's zookeeper image is out of reach), built
# with podman on a registry base when one is reachable, else on one made from
# Debian packages. Layers are reused between runs. Behind a TLS-inspecting
# proxy the host's CA bundle reaches pip as a build secret (in no layer).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/podman.sh
podman_ready
python_base=$(python_base_image)
debian_base=$(base_image "$REGISTRY_DEBIAN_IMAGE")
ca_bundle=${TXLOG_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
secret=()
[ -s "$ca_bundle" ] && secret=(--secret "id=ca-bundle,src=$ca_bundle")

build() {
  local tag=$1; shift
  echo "image: building $tag" >&2
  podman build --quiet --format docker --layers "${secret[@]}" -t "$tag" "$@" >/dev/null
}
build localhost/txlog:dev --build-arg "PYTHON_IMAGE=$python_base" --target service .
build localhost/txlog-spark:dev --build-arg "PYTHON_IMAGE=$python_base" --target spark .
build localhost/txlog-zookeeper:dev --build-arg "BASE_IMAGE=$debian_base" docker/zookeeper
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
  | grep -E '^localhost/txlog(-spark|-zookeeper)?:dev ' >&2
