#!/usr/bin/env bash
# Does a change leave evaluation's numbers alone? Runs the same `foco eval --device cpu` (every method, both world
# protocols, Chord on) on one run folder with the code of two commits, and compares the results JSON's parts.
#
#   bash experiments/eval_same_before_after.sh BEFORE_COMMIT [AFTER_COMMIT (default: the working tree)] [RUN]
#
# RUN (default runs/vit-seeds/seed-0, the demo's run on the ViT backbone) must hold world/, features/, foco/,
# foco-edits/ and described-methods/{p2w,lincir,pact,tscir}-s0 (bash experiments/paper_section.sh methods).
set -euo pipefail
BEFORE=${1:?usage: $0 BEFORE_COMMIT [AFTER_COMMIT] [RUN]}
AFTER=${2:-}
R=${3:-runs/vit-seeds/seed-0}
D=$R/described-methods
PY=${PY:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/before" >/dev/null 2>&1 || true; \
      [ -n "$AFTER" ] && git worktree remove --force "$tmp/after" >/dev/null 2>&1 || true' EXIT
tree() {  # $1 commit (empty: this tree) -> the src folder to import foco from
  if [ -z "$1" ]; then echo "$PWD/src"; else git worktree add -q "$tmp/$2" "$1" && echo "$tmp/$2/src"; fi
}
run() {  # $1 src folder, $2 results file
  PYTHONPATH="$1" "$PY" -m foco eval --benchmark world --root "$R/world" --split test --features "$R/features" \
    --protocols single,multi --device cpu --chord 0.5 \
    --checkpoint "$R/foco" --foco-edits "$R/foco-edits" --pic2word "$D/p2w-s0" --lincir "$D/lincir-s0" \
    --pact "$D/pact-s0" --tscir "$D/tscir-s0" \
    --methods foco,foco-edits,pic2word,lincir,pact,tscir,slerp,sum,image,text --out "$2" >/dev/null
}
run "$(tree "$BEFORE" before)" "$tmp/before.json"
run "$(tree "$AFTER" after)" "$tmp/after.json"
"$PY" - "$tmp/before.json" "$tmp/after.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["parts"] == b["parts"] and a.get("chosen") == b.get("chosen")
for part, e in a["parts"].items():
    print(part, {m: round(v.get("R@1", v.get("mAP@10", 0.0)), 2) for m, v in e["methods"].items()})
print("identical" if same else "DIFFERENT")
sys.exit(0 if same else 1)
PY
