"""The LLM client's throughput and CPU against the stub server (experiments/llm_stub.py), today's code and an older
commit's side by side in one run, and the faults-under-load count check.

For each --concurrency level L and each code tree, `foco decompose --decomposer llm` runs on 8 x L distinct
captions (fresh store) against a stub answering every request after --delay seconds. Reported:
- captions/s: the job's own figure (the decomposition phase: from the first request to the last store write);
- the ceiling L / delay and the share of it reached;
- client CPU per caption: the process's user + system CPU over the run, less a one-caption run's (start-up,
  imports, spaCy), over the captions;
- the stub's counts: most requests in flight, connections opened.
Then one run of today's code with 10 % of requests answered 500 and 5 % invalid: every caption stored once, and
the counts add up.

    python experiments/bench_llm_client.py --old e8e63c6 [--levels 16,64,256 --delay 1.0 --rounds 8]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from old_tree import check_out  # noqa: E402

from foco.utils.provenance import provenance  # noqa: E402


def _stub(port: int, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(ROOT / "experiments" / "llm_stub.py"), "--port", str(port), *args],
                            stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc


def _stats(port: int, reset: bool = False) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/stats", method="POST" if reset else "GET",
                                 data=b"" if reset else None)
    return json.loads(urllib.request.urlopen(req).read())


def _captions(path: Path, n: int, tag: str) -> Path:
    path.write_text("".join(json.dumps({"id": f"{tag}{i}", "caption": f"a red circle {tag}{i} and a blue square "
                                        f"{i} on a sandy beach"}) + "\n" for i in range(n)))
    return path


def run_job(src: Path, inp: Path, store: Path, port: int, concurrency: int, *extra: str) -> dict:
    """One `foco decompose` process of the tree at `src`: its summary, wall time and CPU."""
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "foco.cli", "decompose", "--in", str(inp), "--out", str(store), "--decomposer",
           "llm", "--llm-url", f"http://127.0.0.1:{port}/v1", "--llm-model", "stub", "--concurrency",
           str(concurrency), *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {err[-2000:]}")
    rate = float(re.search(r"\(([\d.]+) captions/s\)", out).group(1))
    return {"captions_per_s": rate, "wall_s": time.perf_counter() - t0,
            "cpu_s": usage.ru_utime + usage.ru_stime, "out": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", default="e8e63c6", help="the commit to compare with (today's code before issue 25)")
    p.add_argument("--levels", default="16,64,256")
    p.add_argument("--delay", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=8, help="captions per level = rounds x concurrency")
    p.add_argument("--port", type=int, default=8831)
    p.add_argument("--faults-n", type=int, default=2000)
    p.add_argument("--trees", default="before,now", help="which code: before (--old), now, or both")
    p.add_argument("--no-faults", action="store_true", help="skip the faults-under-load run")
    p.add_argument("--out", default="runs/bench-llm-client.json")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-llm-"))
    old_src = check_out(a.old)
    trees = {k: v for k, v in {"before": old_src, "now": ROOT / "src"}.items() if k in a.trees.split(",")}
    results: dict = {"machine": provenance()["machine"], "delay_s": a.delay, "old": a.old, "levels": {}}
    stub = _stub(a.port, "--delay", str(a.delay))
    try:
        base = {}
        for name, src in trees.items():  # start-up CPU: a one-caption job, the least of 3 (the first compiles)
            base[name] = min(run_job(src, _captions(tmp / f"one-{name}-{k}.jsonl", 1, f"b{k}"),
                                     tmp / f"one-{name}-{k}.sqlite", a.port, 1)["cpu_s"] for k in range(3))
        results["startup_cpu_s"] = base
        for level in [int(x) for x in a.levels.split(",")]:
            n = a.rounds * level
            row = {}
            for name, src in trees.items():
                inp = _captions(tmp / f"c{level}-{name}.jsonl", n, f"{name}{level}-")
                _stats(a.port, reset=True)
                r = run_job(src, inp, tmp / f"s{level}-{name}.sqlite", a.port, level)
                st = _stats(a.port)
                row[name] = {"captions": n, "captions_per_s": r["captions_per_s"],
                             "share_of_ceiling": r["captions_per_s"] / (level / a.delay),
                             "cpu_ms_per_caption": 1000 * (r["cpu_s"] - base[name]) / n,
                             "max_in_flight": st["max_in_flight"], "connections": st["connections"] - 1,
                             "requests": st["requests"]}
                print(f"concurrency {level:4d} {name:6s}: {r['captions_per_s']:7.1f} captions/s "
                      f"({100 * row[name]['share_of_ceiling']:5.1f} % of {level / a.delay:g}), "
                      f"{row[name]['cpu_ms_per_caption']:.2f} ms CPU/caption, in flight {st['max_in_flight']}, "
                      f"{row[name]['connections']} connections for {st['requests']} requests", flush=True)
            results["levels"][level] = row
    finally:
        stub.terminate()
    if a.no_faults:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=2))
        return
    # Faults under load: today's code, 10 % HTTP 500, 5 % invalid answers.
    stub = _stub(a.port, "--delay", "0.05", "--fail-500", "0.10", "--invalid", "0.05", "--seed", "0")
    try:
        inp = _captions(tmp / "faults.jsonl", a.faults_n, "f")
        store = tmp / "faults.sqlite"
        _stats(a.port, reset=True)
        r = run_job(ROOT / "src", inp, store, a.port, 256, "--backoff", "0.05", "--retries", "2")
        st = _stats(a.port)
    finally:
        stub.terminate()
    counts = {"fallback": 0, "retries": 0, **{k: int(v) for k, v in (kv.split("=") for kv in
                                     r["out"].split("decomposer: ")[1].splitlines()[0].split(", "))}}
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT COUNT(*), COUNT(DISTINCT caption_hash), TOTAL(flag != '') FROM decompositions"
                          ).fetchone()
    rows = tuple(int(x) for x in rows)
    errors = sum(v for k, v in counts.items() if k.startswith("error:"))
    st = {"500": 0, "invalid": 0, **st}
    checks = {
        "stored once": rows[0] == rows[1] == a.faults_n,
        "requests = captions + retries": counts["requests"] == st["requests"] == a.faults_n + counts["retries"],
        "ok + fallback = captions": counts["ok"] + counts["fallback"] == a.faults_n,
        "fallback = flagged rows": counts["fallback"] == rows[2],
        "errors = retries + fallback = stub's 500s + invalid": errors == counts["retries"] + counts["fallback"]
        == st["500"] + st["invalid"]}
    results["faults"] = {"captions": a.faults_n, "stored": rows[0], "distinct": rows[1], "flagged": rows[2],
                         "client": counts, "stub": st, "checks": checks, "captions_per_s": r["captions_per_s"]}
    print(f"faults: {a.faults_n} captions, {rows[0]} rows ({rows[1]} distinct, {rows[2]} flagged); client {counts}; "
          f"stub {st}; checks {checks}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
