#!/usr/bin/env bash
# Peak RSS of `foco eval` (FoCo on the world's test/single part, from an extracted feature cache) on the tiny and
# the default world, for this tree and, when BASE_SRC is given, an old one, in one run on this machine:
#
#   BASE_SRC=/work/head/src bash experiments/bench_eval_memory.sh
#
# Made once under $WORK (default /tmp/foco-evalmem) and reused: the two worlds (`foco world generate`), their
# test/single features from world:pretrained (`foco features extract`), and a FoCo checkpoint on world:pretrained
# (`foco quickstart --size tiny`, or CKPT=FOLDER). Each eval runs under GNU time (`/usr/bin/time -v`) with
# PYTHONPATH set to the tree's src folder; the table (peak RSS, wall time, R@1 and R@10) goes to stdout and to
# $WORK/eval-memory.md, each run's output to $WORK/logs/. The two trees must give the same metrics.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
WORK=${WORK:-/tmp/foco-evalmem}
NEW_SRC=${NEW_SRC:-$ROOT/src}
BASE_SRC=${BASE_SRC:-}
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$WORK/logs"
foco() { PYTHONPATH="$NEW_SRC" "$PY" -m foco "$@"; }

for size in tiny default; do
    [ -f "$WORK/world-$size/world.json" ] || foco world generate --out "$WORK/world-$size" --size "$size" \
        >"$WORK/logs/world-$size.log" 2>&1
    [ -f "$WORK/features-$size/test-single/manifest.json" ] && [ -f "$WORK/features-$size/test-single/done" ] || {
        foco features extract --backbone world:pretrained --world "$WORK/world-$size" --split test/single \
            --out "$WORK/features-$size/test-single" >"$WORK/logs/features-$size.log" 2>&1
        touch "$WORK/features-$size/test-single/done"; }
done
CKPT=${CKPT:-$WORK/quickstart/foco}
[ -f "$CKPT/foco.safetensors" ] || foco quickstart --out "$WORK/quickstart" --size tiny >"$WORK/logs/quickstart.log" 2>&1

table="$WORK/eval-memory.md"
{
    echo "| tree | world | gallery | queries | peak RSS (MB) | wall (s) | FoCo R@1 | FoCo R@10 |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$table"
for tree in new base; do
    src=$NEW_SRC
    if [ "$tree" = base ]; then [ -n "$BASE_SRC" ] || continue; src=$BASE_SRC; fi
    for size in tiny default; do
        log="$WORK/logs/eval-$tree-$size"
        PYTHONPATH="$src" /usr/bin/time -v "$PY" -m foco eval --benchmark world --root "$WORK/world-$size" \
            --split test --protocols single --features "$WORK/features-$size" --methods foco --checkpoint "$CKPT" \
            --out "$log.json" >"$log.out" 2>"$log.err" || { echo "eval $tree $size failed: see $log.err" >&2; exit 1; }
        rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$log.err")
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; printf "%.1f", s}' "$log.err")
        "$PY" - "$log.json" "$tree" "$size" "$rss" "$wall" >>"$table" <<'PYEOF'
import json, sys
res, tree, size, rss, wall = json.load(open(sys.argv[1])), *sys.argv[2:]
part = res["parts"]["world/single"]
m = part["methods"]["foco"]
print(f"| {tree} | {size} | {part['gallery']} | {part['queries']} | {rss} | {wall} | {m['R@1']:.2f} | {m['R@10']:.2f} |")
PYEOF
    done
done
cat "$table"
