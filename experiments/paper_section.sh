#!/usr/bin/env bash
# The paper's experimental section on the test bed (issue 40), measured once after the restaged calibration was
# committed (docs/benchmarks.md): every method (LinCIR and LinCIR +AD included) on the restaged and described test
# protocols, 3 seeds; the full ablation table (1a-5c and the K curve) on both. Resumable: every step skips what an
# earlier run finished (trained checkpoints, evaluated results).
#   bash experiments/paper_section.sh methods    # described_methods.py --protocols restaged,described --lincir
#   bash experiments/paper_section.sh ablate     # foco ablate, seeds 0,1,2, --protocols restaged, then described
# OUT=runs/vit-seeds (experiments/testbed_methods.sh's; seed-0 holds the world with the restaged protocol written at
# the calibrated setting: `foco world restage --strength 0.5 --share 0.9`).
set -euo pipefail
OUT=${OUT:-runs/vit-seeds}
RUN=$OUT/seed-0
PY=${PY:-.venv/bin/python}
FOCO=${FOCO:-.venv/bin/foco}
SEEDS=${SEEDS:-0,1,2}
t() { local s=$SECONDS; "$@"; echo "[$(date -u +%H:%M:%S)] $((SECONDS - s)) s: $*" >&2; }
[ -f "$RUN/world/benchmarks/test/restaged/restaged.json" ] || \
    t "$FOCO" world restage --world "$RUN/world" --strength "${STRENGTH:-0.5}" --share "${SHARE:-0.9}"
join() { local IFS=,; echo "$*"; }
case "${1:-}" in
  methods)
    pact=() tscir=()
    for s in ${SEEDS//,/ }; do pact+=("$RUN/described-methods/pact-s$s") tscir+=("$RUN/described-methods/tscir-s$s"); done
    t "$PY" experiments/described_methods.py --run "$RUN" --seeds-dir "$OUT" --seeds "$SEEDS" \
        --protocols restaged,described --lincir --pact "$(join "${pact[@]}")" --tscir "$(join "${tscir[@]}")" ;;
  ablate)
    variants=$("$PY" -c "from foco.ablation.variants import paper_variants, k_curve_variants as k
print(','.join(dict.fromkeys(paper_variants() + k())))")
    for p in restaged described; do
      precision=$("$PY" -c "import json; print(json.load(open('$RUN/results.json')).get('precision', 'fp32'))")
      t "$FOCO" features extract --backbone world:vit --world "$RUN/world" --split "test/$p" \
          --out "$RUN/features/test-$p" --precision "$precision"  # resumes, or checks an earlier extraction
      t "$FOCO" ablate --world "$RUN/world" --features "$RUN/features" --recipe paper --variants "$variants" \
          --split test --seeds "$SEEDS" --protocols "$p" --out "$OUT/ablate"
    done ;;
  *) echo "usage: $0 methods|ablate" >&2; exit 2 ;;
esac
