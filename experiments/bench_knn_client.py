"""clip-retrieval's real ClipClient against `foco serve`'s /knn-service, before and after issue 38, in one run.

    python experiments/bench_knn_client.py --index runs/quickstart/index [--before 1972005] [--queries 512]
        [--threads 32] [--out report.json]

The client is clip-retrieval's own `clip_client.py`, unmodified (`pip install --no-deps clip-retrieval`; the file
is loaded by path, as its package `__init__` imports the whole back end). Each configuration starts its own
`foco serve` on 127.0.0.1 and a free port, warms it up with 32 queries, then sends `--queries` text queries from
`--threads` threads, each a blocking `ClipClient.query(text=...)`, and reports QPS, p50 and p99 latency and the
errors (an answer that is not a list of results is an error: that is how the client returns a 4xx's body).

Configurations:
- before (the code of `--before`, a git worktree): the client's defaults (use_safety_model, use_violence_detector,
  aesthetic_score 9, aesthetic_weight 0.5), then the defaults overridden (both detectors off, no aesthetic score);
- after (this checkout): the client's defaults, with the micro-batcher (`--max-batch 32 --max-wait-ms 5`, the
  defaults) and without it (`--max-batch 1 --max-wait-ms 0`).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from old_tree import check_out  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
SHAPES = ["circle", "square", "star", "heart", "triangle", "cross", "crescent", "hexagon"]
PLACES = ["in a forest", "on a beach", "in the snow", "in a desert", "by the ocean", "in a city", "on grass", "at night"]
DEFAULTS = {}  # ClipClient's own constructor defaults
OVERRIDDEN = {"use_safety_model": False, "use_violence_detector": False, "aesthetic_score": None,
              "aesthetic_weight": None}


def clip_client_module():
    """clip-retrieval's clip_client.py, loaded by path from the installed distribution."""
    from importlib.metadata import files
    path = next((f.locate() for f in files("clip-retrieval") or [] if str(f).endswith("clip_retrieval/clip_client.py")),
                None)
    if path is None:
        raise SystemExit("clip-retrieval is not installed: pip install --no-deps clip-retrieval (make test does)")
    spec = importlib.util.spec_from_file_location("clip_client", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def texts(n: int) -> list[str]:
    return [f"a {WORDS[i % 8]} {SHAPES[(i // 8) % 8]} {PLACES[(i // 64) % 8]}" for i in range(n)]


def serve(src: Path, index_arg: str, extra: list[str]):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen([sys.executable, "-m", "foco", "serve", "--index", index_arg, "--port", str(port), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("foco serve exited:\n" + proc.stderr.read()[-2000:])
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("foco serve did not answer within 180 s")


def load(client_cls, url: str, name: str, options: dict, queries: list[str], threads: int) -> dict:
    client = client_cls(url + "/knn-service", indice_name=name, num_images=10, **options)

    def one(text: str):
        t0 = time.perf_counter()
        try:
            out = client.query(text=text)
        except Exception as exc:  # noqa: BLE001 (a transport failure is an error of the run)
            return time.perf_counter() - t0, f"{type(exc).__name__}"
        ok = isinstance(out, list) and len(out) > 0
        return time.perf_counter() - t0, None if ok else str(out)[:200]

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, queries[:32]))  # warm-up
        t0 = time.perf_counter()
        done = list(pool.map(one, queries))
        wall = time.perf_counter() - t0
    lat = sorted(d for d, err in done if err is None)
    errors = [err for _, err in done if err is not None]
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
    return {"queries": len(queries), "ok": len(lat), "errors": len(errors), "first_error": errors[0] if errors else None,
            "qps": round(len(lat) / wall, 1), "p50_ms": round(1000 * q[49], 1), "p99_ms": round(1000 * q[98], 1),
            "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index", required=True, help="an index folder (make demo writes runs/quickstart/index)")
    ap.add_argument("--before", default="1972005", help="the commit before issue 38 (its server, measured the same way)")
    ap.add_argument("--queries", type=int, default=512)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    client_cls = clip_client_module().ClipClient
    qs = texts(a.queries)
    index = str(Path(a.index).resolve())
    batched, unbatched = ["--max-batch", "32", "--max-wait-ms", "5"], ["--max-batch", "1", "--max-wait-ms", "0"]
    runs = []
    old_src = check_out(a.before)
    for label, src, index_arg, name, options, extra in [
            ("before: client defaults", old_src, index, "foco", DEFAULTS, batched),
            ("before: defaults overridden", old_src, index, "foco", OVERRIDDEN, batched),
            ("after: client defaults, batched", ROOT / "src", f"foco={index}", "foco", DEFAULTS, batched),
            ("after: client defaults, unbatched", ROOT / "src", f"foco={index}", "foco", DEFAULTS, unbatched)]:
        proc, url = serve(src, index_arg, extra)
        try:
            r = load(client_cls, url, name, options, qs, a.threads)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        runs.append({"run": label, **r})
        print(json.dumps(runs[-1]), flush=True)
    print("\n| run | ok / queries | QPS | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['run']} | {r['ok']} / {r['queries']} | {r['qps']} | {r['p50_ms']} | {r['p99_ms']} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"threads": a.threads, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
