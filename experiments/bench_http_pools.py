"""Why the LLM client pools `http.client` connections rather than using httpx: both against the stub server
(experiments/llm_stub.py, its own process), N POSTs with C threads in flight, in one run. Reports requests/s, CPU per
request of this process, and the connections the stub saw opened.

    python experiments/bench_http_pools.py [--concurrency 256 --requests 2048 --delay 1.0]
"""
from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--requests", type=int, default=2048)
    p.add_argument("--delay", type=float, default=1.0)
    p.add_argument("--port", type=int, default=8812)
    a = p.parse_args()
    stub = subprocess.Popen([sys.executable, str(Path(__file__).with_name("llm_stub.py")), "--port", str(a.port),
                             "--delay", str(a.delay)], stdout=subprocess.PIPE, text=True)
    stub.stdout.readline()
    base = f"http://127.0.0.1:{a.port}"
    body = json.dumps({"model": "x", "messages": [{"role": "system", "content": "s"},
                                                  {"role": "user", "content": "Caption: a b c d e f"}]}).encode()
    headers = {"Content-Type": "application/json"}

    def stats(reset: bool = False) -> dict:
        req = urllib.request.Request(f"{base}/stats", method="POST" if reset else "GET", data=b"" if reset else None)
        return json.loads(urllib.request.urlopen(req).read())

    def measure(name: str, one) -> None:
        stats(reset=True)
        t0, c0 = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(a.concurrency) as pool:
            codes = list(pool.map(one, range(a.requests)))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        st = stats()
        print(f"{name:12s}: {a.requests / dt:6.1f} requests/s, {1000 * cpu / a.requests:.2f} ms CPU/request, "
              f"{st['connections'] - 1} connections, {codes.count(200)} answered 200", flush=True)

    try:
        import httpx
        client = httpx.Client(limits=httpx.Limits(max_connections=a.concurrency,
                                                  max_keepalive_connections=a.concurrency), timeout=60)
        measure(f"httpx {httpx.__version__}", lambda _: client.post(f"{base}/v1/chat/completions", content=body,
                                                                     headers=headers).status_code)
        client.close()
    except ImportError:
        print("httpx is not installed: skipped")
    local = threading.local()

    def one(_):
        conn = getattr(local, "conn", None) or http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
        local.conn = conn
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status

    measure("http.client", one)
    stub.terminate()


if __name__ == "__main__":
    main()
