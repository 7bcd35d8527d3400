#!/usr/bin/env bash
# PACT and TSCIR, 3 seeds (issues 26, 39), with the field's recipe (docs/benchmarks.md "The three trainers"), then
# every method's table on PROTOCOLS. Resumable: each step skips what an earlier run finished.
#   bash experiments/described_composers.sh     # RUN=runs/quickstart SEEDS="0 1 2" PROTOCOLS=described
# SEEDS_DIR holds FoCo and foco-edits per seed (experiments/quickstart_seeds.py). PACT's mapper starts from a
# Pic2Word mapper trained here per seed (RUN/described-methods/p2w-pact-sS) when MAPPER=per-seed, or from
# RUN/field/pic2word (experiments/field_table.py) when MAPPER=field; both read the normalised embedding.
# PARALLEL=1 trains the PACT and TSCIR chains side by side, one thread each (on 2 cores: faster than in turn).
set -euo pipefail
RUN=${RUN:-runs/quickstart}
SEEDS=${SEEDS:-0 1 2}
SEEDS_DIR=${SEEDS_DIR:-runs/seeds}
PROTOCOLS=${PROTOCOLS:-described}
MAPPER=${MAPPER:-field}
PARALLEL=${PARALLEL:-0}
FOCO=${FOCO:-.venv/bin/foco}
PY=${PY:-.venv/bin/python}
OUT=$RUN/described-methods
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
t() { local s=$SECONDS; "$@"; echo "[$(date -u +%H:%M:%S)] $((SECONDS - s)) s: $*" >&2; }
join() { local IFS=,; echo "$*"; }
methods() { t "$PY" experiments/described_methods.py --run "$RUN" --seeds-dir "$SEEDS_DIR" --seeds "$(join $SEEDS)" \
    --protocols "$PROTOCOLS" "$@"; }
[ -f "$RUN/edits2.sqlite" ] || t "$FOCO" edits generate --in "$RUN/world" --out "$RUN/edits2.sqlite" --per-caption 3
if [ "$MAPPER" = per-seed ]; then
  # each seed's PACT initialisation: a Pic2Word mapper on the normalised embedding PACT feeds it, with
  # experiments/field_table.py's settings (2 epochs, lr 5e-4, batch 128, AdamW), seeded; no evaluation here. (The
  # Pic2Word row is described_methods.py's own p2w-sS: the reference's raw input and optimiser.)
  for s in $SEEDS; do
    [ -f "$OUT/p2w-pact-s$s/pic2word.safetensors" ] || t "$FOCO" pic2word train --features "$RUN/features/train" \
        --out "$OUT/p2w-pact-s$s" --epochs 2 --lr 5e-4 --batch-size 128 --optimizer adamw \
        --mapper-input normalized --seed "$s"
  done
fi
# the edit texts' encodings: one cache, or one per chain when the chains run side by side (no two writers)
texts() { if [ "$PARALLEL" = 1 ]; then echo "$RUN/edits2-texts-$1"; else echo "$RUN/edits2-texts"; fi; }
E="--features $RUN/features/train --edits $RUN/edits2.sqlite"
mapper() { if [ "$MAPPER" = per-seed ]; then echo "$OUT/p2w-pact-s$1"; else echo "$RUN/field/pic2word"; fi; }
pact_chain() { for s in $SEEDS; do
  [ -f "$OUT/pact-s$s/composer.json" ] || t "$FOCO" pact train $E --edit-features "$(texts pact)" --out "$OUT/pact-s$s" --seed "$s" \
      --mapper-init "$(mapper "$s")" --identity-epochs 0 --joint-epochs 2 --lr-mapper 1e-4 --lr-text 1e-4
done; }
tscir_chain() { for s in $SEEDS; do
  [ -f "$OUT/tscir-s$s/composer.json" ] || t "$FOCO" tscir train $E --edit-features "$(texts tscir)" --out "$OUT/tscir-s$s" --seed "$s" \
      --stage1-epochs 2 --stage2-epochs 3 --lr-stage2 1e-4 --world "$RUN/world"
done; }
if [ "$PARALLEL" = 1 ]; then
  mkdir -p "$OUT"
  OMP_NUM_THREADS=1 pact_chain > "$OUT/pact-chain.log" 2>&1 &
  p=$!
  OMP_NUM_THREADS=1 tscir_chain > "$OUT/tscir-chain.log" 2>&1 &
  q=$!
  ok=0; wait $p || ok=$?; wait $q || ok=$?
  [ "$ok" = 0 ] || { echo "a chain failed (rc $ok): see $OUT/pact-chain.log and $OUT/tscir-chain.log" >&2; exit "$ok"; }
else
  pact_chain
  tscir_chain
fi
pact=() tscir=()
for s in $SEEDS; do pact+=("$OUT/pact-s$s") tscir+=("$OUT/tscir-s$s"); done
methods --pact "$(join "${pact[@]}")" --tscir "$(join "${tscir[@]}")"
