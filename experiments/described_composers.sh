#!/usr/bin/env bash
# PACT and TSCIR on the described protocol, 3 seeds (issue 26), with the field's recipe (docs/benchmarks.md "The three
# trainers"), then every method's table. Resumable: each step skips what an earlier run finished.
#   bash experiments/described_composers.sh            # RUN=runs/quickstart SEEDS="0 1 2"
set -euo pipefail
RUN=${RUN:-runs/quickstart}
SEEDS=${SEEDS:-0 1 2}
FOCO=${FOCO:-.venv/bin/foco}
PY=${PY:-.venv/bin/python}
OUT=$RUN/described-methods
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
t() { local s=$SECONDS; "$@"; echo "[$(date -u +%H:%M:%S)] $((SECONDS - s)) s: $*" >&2; }
[ -f "$RUN/edits2.sqlite" ] || t "$FOCO" edits generate --in "$RUN/world" --out "$RUN/edits2.sqlite" --per-caption 3
E="--features $RUN/features/train --edits $RUN/edits2.sqlite --edit-features $RUN/edits2-texts"
pact=() tscir=()
for s in $SEEDS; do
  [ -f "$OUT/pact-s$s/composer.json" ] || t "$FOCO" pact train $E --out "$OUT/pact-s$s" --seed "$s" \
      --mapper-init "$RUN/field/pic2word" --identity-epochs 0 --joint-epochs 2 --lr-mapper 1e-4 --lr-text 1e-4
  [ -f "$OUT/tscir-s$s/composer.json" ] || t "$FOCO" tscir train $E --out "$OUT/tscir-s$s" --seed "$s" \
      --stage1-epochs 2 --stage2-epochs 3 --lr-stage2 1e-4 --world "$RUN/world"
  pact+=("$OUT/pact-s$s") tscir+=("$OUT/tscir-s$s")
done
join() { local IFS=,; echo "$*"; }
t "$PY" experiments/described_methods.py --run "$RUN" --seeds "$(join $SEEDS)" \
    --pact "$(join "${pact[@]}")" --tscir "$(join "${tscir[@]}")"
