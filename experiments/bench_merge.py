"""Peak memory of `foco decompose merge`: two synthetic stores of --rows rows each (a realistic decomposition record,
3 pairs, about 400 bytes) merged into a new store, by today's code and by an older commit's, each in its own process,
in one run. Reports peak RSS (ru_maxrss), wall time, and that both outputs hold the same rows.

    python experiments/bench_merge.py --old e8e63c6 [--rows 1000000]
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from old_tree import check_out  # noqa: E402
sys.path.insert(0, str(ROOT / "src"))


def build(path: Path, start: int, n: int) -> None:
    from foco.decompose.schema import caption_hash
    from foco.decompose.store import DecompositionStore, register_settings
    with DecompositionStore(path) as st:
        sid = register_settings(st.db, {"name": "llm", "model": "synthetic", "prompt_version": 1})

        def rows():
            for i in range(start, start + n):
                cap = f"a red circle number {i} and a blue square on a sandy beach under a cloudy sky"
                rec = {"caption": cap, "pairs": [
                    {"local": f"a red circle number {i}", "context": "a blue square on a sandy beach under a cloudy sky"},
                    {"local": "a blue square", "context": f"a red circle number {i} on a sandy beach under a cloudy sky"},
                    {"local": "a sandy beach", "context": f"a red circle number {i} and a blue square"}],
                    "decomposer": {"name": "llm", "model": "synthetic", "prompt_version": 1}}
                yield caption_hash(cap), sid, cap, json.dumps(rec), "llm failed" if i % 97 == 0 else ""
        with st.db:
            st.db.executemany("INSERT INTO decompositions VALUES (?, ?, ?, ?, ?)", rows())


def merge(src: Path, inputs: list[Path], out: Path) -> dict:
    code = ("import sys; from foco.decompose.store import merge_stores; "
            "m = merge_stores(sys.argv[2:], sys.argv[1]); print(m.added, m.identical, m.flagged)")
    env = {**os.environ, "PYTHONPATH": str(src)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(out), *map(str, inputs)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(proc.stderr.read()[-2000:])
    added, identical, flagged = map(int, proc.stdout.read().split())
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "wall_s": time.perf_counter() - t0, "added": added,
            "identical": identical, "flagged": flagged}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--old", default="e8e63c6")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--overlap", type=float, default=0.1, help="share of the second store's rows the first holds too")
    p.add_argument("--out", default="runs/bench-merge.json")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-merge-"))
    old_src = check_out(a.old)
    t0 = time.perf_counter()
    build(tmp / "a.sqlite", 0, a.rows)
    build(tmp / "b.sqlite", int(a.rows * (1 - a.overlap)), a.rows)
    print(f"built two stores of {a.rows:,} rows in {time.perf_counter() - t0:.0f}s "
          f"({(tmp / 'a.sqlite').stat().st_size / 1e6:.0f} MB each)", flush=True)
    res = {}
    for name, src in (("before", old_src), ("now", ROOT / "src")):
        res[name] = merge(src, [tmp / "a.sqlite", tmp / "b.sqlite"], tmp / f"out-{name}.sqlite")
        print(f"{name:6s}: peak RSS {res[name]['peak_rss_mb']:,.0f} MB, {res[name]['wall_s']:.1f}s, "
              f"{res[name]['added']:,} added, {res[name]['identical']:,} identical", flush=True)
    with sqlite3.connect(tmp / "out-now.sqlite") as db:
        db.execute("ATTACH DATABASE ? AS b", (str(tmp / "out-before.sqlite"),))
        diff = db.execute("SELECT (SELECT COUNT(*) FROM (SELECT * FROM main.decompositions EXCEPT SELECT * FROM "
                          "b.decompositions)) + (SELECT COUNT(*) FROM (SELECT * FROM b.decompositions EXCEPT "
                          "SELECT * FROM main.decompositions))").fetchone()[0]
    res["rows_differing"] = diff
    res["rows"] = a.rows
    print(f"rows differing between the two outputs: {diff}")
    for f in tmp.glob("*.sqlite*"):
        f.unlink()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
