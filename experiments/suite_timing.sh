#!/usr/bin/env bash
# The suite's time as CI pays it (issues 37 and 53): each run is `make test` in a fresh clone of HEAD with a fresh
# .venv (pip's cache is warm, as on any machine that installed once), so the installation is included.
#   bash experiments/suite_timing.sh [OUT]            three fresh-clone runs in a row, then make test-fast
#   FULL=1 bash experiments/suite_timing.sh [OUT]     also a serial run first and a reversed-order run after
# (about 30 min on the 2-core development machine; 50 with FULL=1). Each run prints one line: wall seconds of make
# (installation included), the CPU-seconds of everything it ran (user + system, /usr/bin/time), pytest's own
# seconds and its pass line.
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
  (cd "$clone" && /usr/bin/time -f "cpu %U %S" -o "$OUT/$name.time" env "$@" > "$OUT/$name.log" 2>&1)
  local rc=$?
  t1=$(date +%s.%N)
  local line cpu
  line=$(grep -E "[0-9]+ passed" "$OUT/$name.log" | tail -1)
  cpu=$(awk '/^cpu/ {printf "%.0f", $2 + $3}' "$OUT/$name.time")
  printf '%-10s make %6.1f s  cpu %5s s  rc %d  %s\n' "$name" "$(echo "$t1 - $t0" | bc)" "$cpu" "$rc" "$line"
}

fresh() {  # a fresh clone of HEAD, with no .venv
  local dir=$OUT/clone
  rm -rf "$dir"
  git clone -q "$ROOT" "$dir"
  git -C "$dir" checkout -q "$HEAD"
  echo "$dir"
}

if [ -n "${FULL:-}" ]; then
  run serial "$(fresh)" make test PYTEST_WORKERS=0
fi
for i in 1 2 3; do
  run "parallel$i" "$(fresh)" make test
done
if [ -n "${FULL:-}" ]; then
  run reversed "$(fresh)" PYTEST_ADDOPTS="--order reverse" make test
fi
run fast "$OUT/clone" make test-fast
