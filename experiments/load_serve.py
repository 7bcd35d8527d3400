"""A bounded load test of `foco serve` on loopback: C concurrent clients POST /search for S seconds, then stop.

    python experiments/load_serve.py --index runs/quickstart/index --checkpoint runs/quickstart/foco \
        [--clients 16] [--seconds 60] [--method foco] [--k 10]

It starts the server itself on 127.0.0.1 and a free port (it never targets another host), waits for /healthz,
sends queries (a random indexed reference and one of a few instructions) from `--clients` threads until the time
is up, and reports QPS, p50 / p99 latency, errors, and the server's resident memory before and after.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

TEXTS = ["make the circle blue", "add a star", "remove the square", "have the ocean in place of the forest",
         "make the heart bigger", "a cross instead of the crescent"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--method", default="foco")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    a = ap.parse_args()
    port = _free_port()
    cmd = [sys.executable, "-m", "foco", "serve", "--index", a.index, "--port", str(port)]
    if a.checkpoint:
        cmd += ["--checkpoint", a.checkpoint]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                    health = json.loads(r.read())
                    break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit("foco serve did not start")
                time.sleep(0.3)
        n_images = health["images"]
        ids = [i["id"] for i in json.loads(urllib.request.urlopen(url + "/gallery?limit=500").read())["items"]]
        # one warm-up query (first use loads the method), then measure
        urllib.request.urlopen(urllib.request.Request(url + "/search", data=urllib.parse.urlencode(
            {"reference_id": ids[0], "text": TEXTS[0], "method": a.method, "k": a.k}).encode()), timeout=120).read()
        rss_before = _rss_mb(server.pid)
        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        stop_at = time.time() + a.seconds

        def client(seed: int) -> None:
            rng = random.Random(seed)
            while time.time() < stop_at:
                body = urllib.parse.urlencode({"reference_id": rng.choice(ids), "text": rng.choice(TEXTS),
                                               "method": a.method, "k": a.k}).encode()
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(urllib.request.Request(url + "/search", data=body), timeout=60) as r:
                        r.read()
                        ok = r.status == 200
                except OSError as exc:
                    ok, why = False, str(exc)
                dt = time.perf_counter() - t0
                with lock:
                    if ok:
                        latencies.append(dt)
                    else:
                        errors.append(why)

        t0 = time.time()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        rss_after = _rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    lat = sorted(latencies)
    report = {"clients": a.clients, "seconds": round(wall, 1), "images": n_images, "method": a.method, "k": a.k,
              "requests": len(lat), "errors": len(errors), "qps": round(len(lat) / wall, 2),
              "p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
              "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
              "rss_mb_before": round(rss_before, 1), "rss_mb_after": round(rss_after, 1)}
    print(json.dumps(report, indent=2))
    if errors:
        print("first errors:", errors[:3])
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
