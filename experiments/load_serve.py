"""A bounded load test of `foco serve` on loopback: batched against unbatched, at several client counts, in one run.

    python experiments/load_serve.py --index runs/quickstart/index --checkpoint runs/quickstart/foco \
        [--clients 1,8,32,64] [--seconds 20] [--method foco] [--k 10] [--out report.json]

For each mode (batched: `--max-batch 32 --max-wait-ms 5`, the defaults; unbatched: `--max-batch 1 --max-wait-ms
0`, one query at a time) it starts the server itself on 127.0.0.1 and a free port (it never targets another host),
waits for /healthz, warms it up, then for each client count runs that many concurrent clients (asyncio + httpx,
one connection each) posting /search with a random indexed reference and one of a few instructions, for
`--seconds`. During every run a separate process asks /healthz every 50 ms and records its latency. It reports
QPS, p50 and p99 per client count, errors, /healthz p50 and p99, and the server's resident memory before the
first run and after the last.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

TEXTS = ["make the circle blue", "add a star", "remove the square", "have the ocean in place of the forest",
         "make the heart bigger", "a cross instead of the crescent"]
MODES = {"batched": ["--max-batch", "32", "--max-wait-ms", "5"], "unbatched": ["--max-batch", "1", "--max-wait-ms", "0"]}
PROBE = """
import json, sys, time, httpx
url, until, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
lat, errors = [], 0
with httpx.Client(timeout=30) as c:
    while time.time() < until:
        t0 = time.perf_counter()
        try:
            ok = c.get(url + "/healthz").status_code == 200
        except httpx.HTTPError:
            ok = False
        lat.append(time.perf_counter() - t0) if ok else None
        errors += not ok
        time.sleep(0.05)
open(out, "w").write(json.dumps({"latencies": lat, "errors": errors}))
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 1) if xs else None


async def _load(url: str, ids: list[int], clients: int, seconds: float, method: str, k: int) -> dict:
    import httpx
    latencies, errors = [], []
    stop_at = time.time() + seconds

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1)) as c:
            while time.time() < stop_at:
                data = {"reference_id": str(rng.choice(ids)), "text": rng.choice(TEXTS), "method": method, "k": str(k)}
                t0 = time.perf_counter()
                try:
                    r = await c.post(url + "/search", data=data)
                    ok, why = r.status_code == 200, r.text[:200]
                except httpx.HTTPError as exc:
                    ok, why = False, repr(exc)
                (latencies.append(time.perf_counter() - t0) if ok else errors.append(why))

    t0 = time.time()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.time() - t0
    return {"clients": clients, "seconds": round(wall, 1), "requests": len(latencies), "errors": len(errors),
            "first_errors": errors[:3], "qps": round(len(latencies) / wall, 2),
            "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
            "p99_ms": _pct(latencies, 0.99)}


def run_mode(a, mode: str) -> dict:
    import httpx
    port = _free_port()
    cmd = [sys.executable, "-m", "foco", "serve", "--index", a.index, "--port", str(port), *MODES[mode]]
    if a.checkpoint:
        cmd += ["--checkpoint", a.checkpoint]
    import os
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(a.server_threads)} if a.server_threads else {}))
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                health = httpx.get(url + "/healthz", timeout=2).json()
                break
            except httpx.HTTPError:
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"foco serve did not start: {server.stderr.read()[-2000:]}")
                time.sleep(0.3)
        ids = [i["id"] for i in httpx.get(url + "/gallery?limit=500").json()["items"]]
        for _ in range(3):  # warm-up: first use loads the method
            httpx.post(url + "/search", data={"reference_id": str(ids[0]), "text": TEXTS[0], "method": a.method,
                                              "k": str(a.k)}, timeout=120).raise_for_status()
        rss_before = _rss_mb(server.pid)
        runs = []
        for clients in a.clients:
            probe_out = Path(a.work) / f"probe-{mode}-{clients}.json"
            probe = subprocess.Popen([sys.executable, "-c", PROBE, url, str(time.time() + a.seconds), str(probe_out)])
            run = asyncio.run(_load(url, ids, clients, a.seconds, a.method, a.k))
            probe.wait(timeout=a.seconds + 60)
            p = json.loads(probe_out.read_text())
            run.update({"healthz_p50_ms": round(1000 * statistics.median(p["latencies"]), 1) if p["latencies"] else None,
                        "healthz_p99_ms": _pct(p["latencies"], 0.99), "healthz_errors": p["errors"]})
            runs.append(run)
            print(f"{mode} {json.dumps(run)}", file=sys.stderr, flush=True)
        time.sleep(1.0)  # the last batch's memory handed back
        rss_after = _rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {"images": health["images"], "rss_mb_before": round(rss_before, 1), "rss_mb_after": round(rss_after, 1),
            "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--clients", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8, 32, 64])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--method", default="foco")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--modes", default="batched,unbatched")
    ap.add_argument("--server-threads", type=int, default=None,
                    help="OMP_NUM_THREADS of the server (its torch threads); default: torch's own choice")
    ap.add_argument("--work", default="/tmp/foco-load")
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    a = ap.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    report = {"method": a.method, "k": a.k, "modes": {m: run_mode(a, m) for m in a.modes.split(",")}}
    print(json.dumps(report, indent=2))
    print("\n| mode | clients | QPS | p50 | p99 | errors | /healthz p50 | /healthz p99 |\n|---|---|---|---|---|---|---|---|")
    for mode, r in report["modes"].items():
        for run in r["runs"]:
            print(f"| {mode} | {run['clients']} | {run['qps']} | {run['p50_ms']} ms | {run['p99_ms']} ms | "
                  f"{run['errors']} | {run['healthz_p50_ms']} ms | {run['healthz_p99_ms']} ms |")
    for mode, r in report["modes"].items():
        print(f"{mode}: server RSS {r['rss_mb_before']} MB before, {r['rss_mb_after']} MB after")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
