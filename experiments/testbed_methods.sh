#!/usr/bin/env bash
# Every method on one world backbone, 3 training seeds, both test protocols (issue 39). Two steps, so that the
# described share is fixed (and committed) before any trained method sees the described protocol:
#   bash experiments/testbed_methods.sh calibrate   # FoCo + foco-edits (quickstart, 3 seeds), then the share on val
#                                                   # with image, text and sum alone (described_calibration.py)
#   bash experiments/testbed_methods.sh methods     # Pic2Word, PACT, TSCIR (3 seeds); every method on single and
#                                                   # described test with text reliance; FoCo's two routes alone
# BACKBONE=vit|cnn (quickstart --backbone), OUT=runs/vit-seeds. OUT/seed-0 may be a link to a `make demo` folder
# (runs/quickstart is seed 0 of the vit backbone). Resumable: every step skips what an earlier run finished.
set -euo pipefail
BACKBONE=${BACKBONE:-vit}
OUT=${OUT:-runs/vit-seeds}
PY=${PY:-.venv/bin/python}
SEEDS="0 1 2"
t() { local s=$SECONDS; "$@"; echo "[$(date -u +%H:%M:%S)] $((SECONDS - s)) s: $*" >&2; }
case "${1:-}" in
  calibrate)
    t "$PY" experiments/quickstart_seeds.py --seeds 0,1,2 --out "$OUT" --backbone "$BACKBONE"
    t "$PY" experiments/described_calibration.py --run "$OUT/seed-0" ;;
  methods)
    # the described protocol at the share committed by `calibrate` (docs/benchmarks.md: 0.85 on world:vit)
    [ -f "$OUT/seed-0/world/benchmarks/test/described/described.json" ] || \
        t "$PY" -m foco world describe --world "$OUT/seed-0/world" --share "${SHARE:-0.85}"
    t env RUN="$OUT/seed-0" SEEDS="$SEEDS" SEEDS_DIR="$OUT" PROTOCOLS=single,described MAPPER=per-seed \
        PARALLEL=1 bash experiments/described_composers.sh
    t "$PY" experiments/foco_routes.py --world "$OUT/seed-0/world" --features "$OUT/seed-0/features" \
        --checkpoints "$OUT"/seed-{0,1,2}/foco --protocols single,described --out "$OUT/routes.json" ;;
  *) echo "usage: $0 calibrate|methods" >&2; exit 2 ;;
esac
