#!/usr/bin/env bash
# The suite's time as CI pays it (issue 37): each run is `make test` in a fresh clone of HEAD with a fresh .venv
# (pip's cache is warm, as on any machine that installed once), so the installation is included.
#   bash experiments/suite_timing.sh [OUT]     (about 45 min on the 2-core development machine)
# Runs, one after the other on the same machine:
#   1. serial:      make test PYTEST_WORKERS=0 (one process, no xdist: the old way)
#   2-4. parallel:  make test, three times in a row (pytest-xdist on every core)
#   5. reversed:    make test with PYTEST_ADDOPTS="--order reverse" (no result may depend on the order)
#   6. fast:        make test-fast in the last clone (its .venv already installed)
# and prints one line per run: wall seconds of make, pytest's own seconds, and pytest's pass line.
set -u
OUT=${1:-/tmp/suite-timing}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HEAD=$(git -C "$ROOT" rev-parse --short HEAD)
mkdir -p "$OUT"
echo "commit $HEAD; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); logs in $OUT"

run() {  # NAME CLONE MAKE-ARGS...
  local name=$1 clone=$2
  shift 2
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$clone" && env "$@" > "$OUT/$name.log" 2>&1)
  local rc=$?
  t1=$(date +%s.%N)
  local line
  line=$(grep -E "[0-9]+ passed" "$OUT/$name.log" | tail -1)
  printf '%-10s make %6.1f s  rc %d  %s\n' "$name" "$(echo "$t1 - $t0" | bc)" "$rc" "$line"
}

fresh() {  # a fresh clone of HEAD, with no .venv
  local dir=$OUT/clone
  rm -rf "$dir"
  git clone -q "$ROOT" "$dir"
  git -C "$dir" checkout -q "$HEAD"
  echo "$dir"
}

run serial "$(fresh)" make test PYTEST_WORKERS=0
for i in 1 2 3; do
  run "parallel$i" "$(fresh)" make test
done
run reversed "$(fresh)" PYTEST_ADDOPTS="--order reverse" make test
run fast "$OUT/clone" make test-fast
