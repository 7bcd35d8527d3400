#!/usr/bin/env bash
# Peak RSS and wall time of one `foco train` epoch (stage 2 only, a feature corpus read with --in) at N and 10N
# images, for the new code tree and, when BASE_SRC is given, an old one, in one run on this machine:
#
#   BASE_SRC=/work/baseline/src bash experiments/bench_memory.sh [N]        (N default 20000: 20000 and 200000)
#
# The corpora are synthetic (experiments/synthetic_corpus.py: random world-backbone-sized fp16 features, 3 pairs
# per caption, in the layout `foco features extract --in` writes) under $WORK (default /tmp/foco-mem), made once and
# reused by later runs. Each training runs under GNU time (`/usr/bin/time -v`; Debian package `time`, installed if
# missing) as `python -m foco train` with PYTHONPATH set to the tree's src folder; "Maximum resident set size" and
# "Elapsed (wall clock) time" are read from its report. A run that fails (e.g. killed for memory) is reported in the
# table with its exit status, and the others still run. The table goes to stdout and to $WORK/memory.md; each run's
# output is in $WORK/logs/. The 1-minute load average at each run's start is noted under the table: the wall times
# count only when the machine was otherwise idle.
#
# Environment: NEW_SRC (default: this checkout's src), BASE_SRC (unset: only the new tree), PY (default: this
# checkout's .venv/bin/python), WORK, SHARD_IMAGES (images per shard and feature part, default 10000),
# GEN_SRC (the foco that writes the corpora: default BASE_SRC when set, else NEW_SRC; it must write the old layout,
# which synthetic_corpus.py checks: a tree whose feature caches changed layout is refused, so set GEN_SRC then),
# TRAIN_ARGS (default "--stage1-epochs 0 --stage2-epochs 1 --batch-size 512 --max-negatives 31").
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
N=${1:-20000}
WORK=${WORK:-/tmp/foco-mem}
NEW_SRC=${NEW_SRC:-$ROOT/src}
BASE_SRC=${BASE_SRC:-}
PY=${PY:-$ROOT/.venv/bin/python}
SHARD_IMAGES=${SHARD_IMAGES:-10000}
GEN_SRC=${GEN_SRC:-${BASE_SRC:-$NEW_SRC}}
DEFAULT_TRAIN_ARGS="--stage1-epochs 0 --stage2-epochs 1 --batch-size 512 --max-negatives 31"
TRAIN_ARGS=${TRAIN_ARGS:-$DEFAULT_TRAIN_ARGS}
SIZES=("$N" "$((10 * N))")
mkdir -p "$WORK/logs"

if ! /usr/bin/time -v true >/dev/null 2>&1; then
    echo "installing GNU time (Debian package 'time')" >&2
    if [ "$(id -u)" = 0 ]; then apt-get install -y time >&2; else sudo apt-get install -y time >&2; fi
fi

# --- the corpora: DIR/shards, DIR/features, DIR/decompositions.sqlite; DIR/synthetic.json marks one complete ---
corpus() { echo "$WORK/corpus-$1"; }
for n in "${SIZES[@]}"; do
    dir=$(corpus "$n")
    if [ -f "$dir/synthetic.json" ]; then
        echo "corpus of $n images: $dir (reused)"
    else
        echo "corpus of $n images: writing $dir"
        PYTHONPATH="$GEN_SRC" "$PY" "$HERE/synthetic_corpus.py" --images "$n" --shard-images "$SHARD_IMAGES" \
            --out "$dir" 2>"$WORK/logs/corpus-$n.err" | grep -v -e '^  foco train' -e '^train one epoch' || { cat "$WORK/logs/corpus-$n.err" >&2; exit 1; }
    fi
done

pattern() {  # the corpus's shard pattern, as its corpus.json records it
    "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pattern"])' "$(corpus "$1")/features/corpus.json"
}

describe() {  # a tree's commit, "+changes" when its work tree differs
    local src=$1 rev
    rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "?")
    [ -n "$(git -C "$src" status --porcelain -- . 2>/dev/null)" ] && rev="$rev+changes"
    echo "$rev"
}

# --- the trainings ---
TREES=("new=$NEW_SRC")
[ -n "$BASE_SRC" ] && TREES+=("base=$BASE_SRC")
ROWS=(); LOADS=()
for entry in "${TREES[@]}"; do
    tree=${entry%%=*}; src=${entry#*=}
    where=$(PYTHONPATH="$src" "$PY" -c 'import foco; print(foco.__file__)')
    case "$where" in "$src"/*) ;; *) echo "PYTHONPATH=$src imports foco from $where, not from $src" >&2; exit 1;; esac
    echo "tree $tree: $src ($(describe "$src"))"
    first_rss=""
    for n in "${SIZES[@]}"; do
        dir=$(corpus "$n"); out="$WORK/train-$tree-$n"; report="$WORK/logs/time-$tree-$n.txt"
        rm -rf "$out"
        load=$(cut -d' ' -f1 /proc/loadavg)  # other work on the machine slows the wall time, not the peak RSS
        LOADS+=("$tree/$n $load")
        echo "  $tree, $n images: training one epoch (load average $load) ..."
        # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
        if PYTHONPATH="$src" /usr/bin/time -v -o "$report" "$PY" -m foco train --in "$(pattern "$n")" \
            --features "$dir/features" --decompositions "$dir/decompositions.sqlite" --out "$out" $TRAIN_ARGS \
            >"$WORK/logs/train-$tree-$n.log" 2>&1; then status=ok; else status="failed (exit $?)"; fi
        rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$report")
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0;
                                                     for (i = 1; i <= n; i++) s = s * 60 + t[i]; printf "%.1f", s}' "$report")
        rss_mb=$(awk -v k="$rss_kb" 'BEGIN {printf "%.0f", k / 1024}')
        ratio=""
        if [ -z "$first_rss" ]; then first_rss=$rss_kb
        else ratio=$(awk -v a="$rss_kb" -v b="$first_rss" 'BEGIN {printf "%.2f", a / b}'); fi
        [ "$status" = ok ] || { rss_mb="$rss_mb ($status)"; tail -3 "$WORK/logs/train-$tree-$n.log" >&2; }
        echo "  $tree, $n images: peak RSS $rss_mb MB, $wall s"
        ROWS+=("| $tree ($(describe "$src")) | $n | $rss_mb | $wall | $ratio |")
    done
done

{
    echo "Peak RSS of one \`foco train\` epoch ($TRAIN_ARGS) on synthetic feature corpora"
    echo "(experiments/synthetic_corpus.py, $SHARD_IMAGES images per part), $(nproc) CPUs, $(date -u +%Y-%m-%d)."
    env=""
    [ -n "$BASE_SRC" ] && env+="BASE_SRC=$BASE_SRC "
    [ "$TRAIN_ARGS" != "$DEFAULT_TRAIN_ARGS" ] && env+="TRAIN_ARGS='$TRAIN_ARGS' "
    [ "$SHARD_IMAGES" != 10000 ] && env+="SHARD_IMAGES=$SHARD_IMAGES "
    echo "Reproduce: \`${env}bash experiments/bench_memory.sh $N\`"
    echo
    echo "| tree | N | peak RSS MB | wall s | ratio 10N/N |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Load average (1 min) when each run started: $(IFS=,; echo "${LOADS[*]}" | sed 's/,/, /g')."
} | tee "$WORK/memory.md"
