#!/usr/bin/env bash
# 1 against 2 processes on this machine, in one run: FoCo training steps/s (stage 1 + stage 2, batch 128, fp32) and
# feature extraction images/s from webdataset shards (ranks split the shards).
#   bash experiments/bench_scale.sh RUN OUT      (RUN: a quickstart folder, e.g. runs/quickstart)
set -euo pipefail
RUN=${1:-runs/quickstart}; OUT=${2:-runs/bench-scale}
FOCO=${FOCO:-.venv/bin/foco}; TORCHRUN=${TORCHRUN:-.venv/bin/torchrun}
rm -rf "$OUT" && mkdir -p "$OUT"
"$FOCO" world export --world "$RUN/world" --format webdataset --split train --out "$OUT/shards" --shard-size 1000 >/dev/null
PATTERN="$OUT/shards/{00000..00009}.tar"
TRAIN=(train --features "$RUN/features/train" --world "$RUN/world" --stage1-epochs 1 --stage2-epochs 1
       --batch-size 128 --max-negatives 31 --learn-bias)
t() { local s=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc; }
echo "train, 1 process (2 threads): $(t "$FOCO" "${TRAIN[@]}" --out "$OUT/t1") s"
echo "train, 2 processes (1 thread each): $(OMP_NUM_THREADS=1 t "$TORCHRUN" --nproc_per_node 2 -m foco "${TRAIN[@]}" --out "$OUT/t2") s"
echo "extract, 1 process: $(t "$FOCO" features extract --backbone world:pretrained --in "$PATTERN" --out "$OUT/x1" --workers 1) s"
echo "extract, 2 processes: $(OMP_NUM_THREADS=1 t "$TORCHRUN" --nproc_per_node 2 -m foco features extract --backbone world:pretrained --in "$PATTERN" --out "$OUT/x2" --workers 1) s"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for run in ("t1", "t2"):
    log = [json.loads(l) for l in open(f"{out}/{run}/train_log.jsonl")]
    print(run, "elapsed per epoch (s):", [r["elapsed_s"] for r in log], "steps per epoch: 78")
PY
