#!/usr/bin/env bash
# Build the Dockerfile's images with Debian's podman and buildah, where no image registry is reachable
# (only the package registries), as tests/test_image.py does and docs/DEPLOYMENT.md describes:
#
#   scripts/podman_build.sh service            # --target service: the runtime without models
#   scripts/podman_build.sh runtime [PROFILE]  # the runtime with models (PROFILE tiny by default here)
#   scripts/podman_build.sh env                # print the environment that points podman at this state
#   scripts/podman_build.sh prune              # remove the whole state: containers, images, layers, cache
#   scripts/podman_build.sh dangling           # remove the untagged layers replaced builds left
#   scripts/podman_build.sh standins           # redis, prometheus and haproxy stand-ins from Debian packages
#   scripts/podman_build.sh loadtest           # --target loadtest: locust with the load tests
#
# Everything lives in a private state folder (PODMAN_STATE, default the project's cache outside the clone,
# ~/.cache/transformer-serving/podman: harness/cache.py), so that a fresh clone of the same tree reuses
# the layers podman keyed on each instruction and the content it copies (a changed file rebuilds from
# its layer on; nothing stale is reused). Its
# containers.conf and storage.conf through CONTAINERS_CONF and CONTAINERS_STORAGE_CONF, never the
# machine's. The bases the Dockerfile takes as build args are made locally when missing:
#   localhost/debian:bookworm          mmdebstrap (minbase) from this machine's apt sources, podman import
#   localhost/python:3.11-bookworm     that, plus Debian's Python 3.11 in a venv on PATH (PYTHON_IMAGE)
# The runtime's CUDA base is replaced by the Debian one (a CPU image: CUDA_IMAGE is a build arg).
# torch for the export stage comes from a local index (TORCH_INDEX_URL) of `pip download torch==2.13.0`:
# the CPU wheel index's host is not reachable here.
# Needs root, podman, buildah, runc and mmdebstrap (scripts/setup.sh --test-tools installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE_ROOT=${TSERVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/transformer-serving}
STATE=${PODMAN_STATE:-$CACHE_ROOT/podman}
mkdir -p "$STATE"
STATE=$(realpath "$STATE")
DEBIAN_IMAGE=localhost/debian:bookworm
PYTHON_IMAGE=localhost/python:3.11-bookworm
TAG=${IMAGE_TAG:-localhost/transformer-serving}
DATA_DIR=${DATA_DIR:-../shared/data}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

# runc, not crun: this machine class mounts cgroups v1 and v2 side by side (hybrid), which crun refuses.
# Ulimits under the sandbox's hard limits (podman's default nofile of 1048576 cannot be granted).
# The Docker image format keeps HEALTHCHECK, which OCI's drops. netavark, with aardvark-dns: containers
# find each other by name and alias (the compose test); its network definitions stay podman's own
# (/etc/containers/networks): moved into this state, a restarted container broke the compose network.
cat > "$STATE/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]

[engine]
runtime = "runc"

[network]
network_backend = "netavark"
CONF
cat > "$STATE/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$STATE/storage"
runroot = "$STATE/run"
CONF
export CONTAINERS_CONF="$STATE/containers.conf" CONTAINERS_STORAGE_CONF="$STATE/storage.conf"
export BUILDAH_FORMAT=docker

if [ "${1:-}" = "env" ]; then
  echo "export CONTAINERS_CONF=$CONTAINERS_CONF CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF"
  exit 0
fi
if [ "${1:-}" = "prune" ]; then
  # podman first, so that it removes this state's containers and unmounts its overlay layers; then
  # whatever is left of the folder. Not `podman system reset`: it also removes every podman network
  # defined on the machine (their definitions live outside any storage), a running compose test's
  # included. The machine's own podman storage and networks are never touched (a network a crashed
  # compose test left stays: `podman network rm ts-compose-...`).
  before=$(du -sh "$STATE" 2>/dev/null | cut -f1)
  if command -v podman >/dev/null && [ -d "$STATE/storage" ]; then
    podman rm --all --force --time 0 >/dev/null 2>&1 || true
    podman rmi --all --force >/dev/null 2>&1 || echo "podman_build: podman rmi failed; removing the folder" >&2
  fi
  rm -rf "$STATE"
  echo "podman_build: removed $STATE ($before)" >&2
  exit 0
fi
# One build at a time in this state, whoever asks (the image and compose tests run on two workers): the
# bases, the torch index's fixed port and the layer cache are shared, and a prune between two builds'
# steps could take a layer one of them is about to reuse. A second build waits here, then finds the
# first one's layers cached.
exec 9>"$STATE/build.lock"
flock 9

if [ "${1:-}" = "dangling" ]; then
  # The untagged layers replaced builds left (the deployment tests' clean-up), never a tagged stage's.
  podman image prune --force >/dev/null
  exit 0
fi
for tool in podman buildah runc mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "podman_build: $tool is missing: scripts/setup.sh --test-tools" >&2; exit 1; }
done

say() { echo "podman_build: $*" >&2; }

if ! podman image exists "$DEBIAN_IMAGE"; then
  say "making $DEBIAN_IMAGE with mmdebstrap (this machine's apt sources)"
  sources=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] && sources+=("$f")
  done
  # The machine's own extra certificate authorities go in too (a TLS-inspecting egress proxy's, say),
  # and pip is pointed at the system bundle: pip's vendored certifi knows none of them.
  mmdebstrap --quiet --variant=minbase --include=ca-certificates \
    --customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share' \
    --customize-hook='chroot "$1" update-ca-certificates' \
    bookworm "$STATE/debian.tar" "${sources[@]}"
  podman import --change 'CMD ["/bin/bash"]' --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    "$STATE/debian.tar" "$DEBIAN_IMAGE" >/dev/null
  rm -f "$STATE/debian.tar"
fi
if ! podman image exists "$PYTHON_IMAGE"; then
  say "making $PYTHON_IMAGE"
  podman build --quiet --network host --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" -t "$PYTHON_IMAGE" \
    -f deploy/podman/python-base.Containerfile deploy/podman >/dev/null
fi

# torch and what it needs, as a PEP 503 index served on loopback to the build (host network).
torch_index() {
  local wheels="$STATE/torch-index"
  if ! ls "$wheels"/torch-"$TORCH_VERSION"*.whl >/dev/null 2>&1; then
    say "gathering torch==$TORCH_VERSION and its requirements into $wheels"
    python3 -m pip download --quiet --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
      -d "$wheels" "torch==$TORCH_VERSION"
  fi
  python3 deploy/podman/simple_index.py "$wheels"
}

build() {  # build TARGET TAG [ARGS...]
  local target=$1 tag=$2
  shift 2
  say "building --target $target as $tag"
  local started=$SECONDS
  podman build --network host --format docker --layers \
    --build-arg CUDA_IMAGE="$DEBIAN_IMAGE" --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" \
    --target "$target" -t "$tag" "$@" .
  say "built $tag in $((SECONDS - started)) s"
}

# The stages that no final image grows from (their results come in by COPY --from) are left untagged, and
# `podman image prune` (the deployment tests' clean-up of replaced builds) removes untagged leaves: the next
# build, from any clone, then redid torch's install and the training. Tagged, a stage's layers stay until a
# changed source replaces them. Built first, each on its own: the final build then finds them cached.
keep_stage() {  # keep_stage STAGE TAG [ARGS...]
  local stage=$1 tag=$2
  shift 2
  say "building --target $stage as $tag (kept for the layer cache)"
  podman build --quiet --network host --format docker --layers \
    --build-arg CUDA_IMAGE="$DEBIAN_IMAGE" --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" \
    --target "$stage" -t "$tag" "$@" . >/dev/null
}

case "${1:-}" in
  service)
    keep_stage service-build "$TAG-stages:service-build"
    build service "$TAG:service"
    ;;
  runtime)
    profile=${2:-tiny}
    torch_index
    # A fixed port: TORCH_INDEX_URL is a build arg, and a new value each time would void the layer cache.
    port=${TORCH_INDEX_PORT:-38417}
    python3 -m http.server --bind 127.0.0.1 --directory "$STATE/torch-index" "$port" >/dev/null 2>&1 &
    server=$!
    trap 'kill $server 2>/dev/null || true' EXIT  # it may have ended (the port was taken): not a failure
    keep_stage service-build "$TAG-stages:service-build"
    keep_stage export "$TAG-stages:export-$profile" --build-context data="$DATA_DIR" --build-arg PROFILE="$profile" \
      --build-arg TORCH_INDEX_URL="http://127.0.0.1:$port/simple"
    build runtime "$TAG:$profile" --build-context data="$DATA_DIR" --build-arg PROFILE="$profile" \
      --build-arg TORCH_INDEX_URL="http://127.0.0.1:$port/simple"
    ;;
  loadtest)
    build loadtest "$TAG-locust:latest"
    ;;
  standins)
    # The third-party images docker-compose.yml names, tagged with its names: Debian's packages on the
    # local base (deploy/podman/standins.Containerfile), never the images themselves (no registry here).
    for pair in redis=docker.io/library/redis:7-alpine prometheus=docker.io/prom/prometheus:v3.5.0 \
                haproxy=docker.io/library/haproxy:2.6; do
      target=${pair%%=*} tag=${pair#*=}
      say "building the stand-in $tag: Debian 12's $target package, not the image of that name"
      podman build --quiet --network host --format docker --layers --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" \
        --target "$target" -t "$tag" -f deploy/podman/standins.Containerfile deploy/podman >/dev/null
    done
    ;;
  *)
    sed -n '2,10p' "$0" >&2
    exit 2
    ;;
esac
