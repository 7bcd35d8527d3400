"""Issue 43: the memory and time of the shard index's one-process step (`foco.search.shards.fill_index`), from N
random D-d float16 vectors in per-shard feature caches (the layout `foco features extract --in` and
`foco index build --in` write), and the coarse quantizer's assignment cost, flat against HNSW.

    python experiments/bench_index_shards.py --n 100000 1000000 --work /tmp/bench_shards \
        --index-type IVF1024,Flat --ondisk --train-size 40960
    python experiments/bench_index_shards.py --quantizer 16384 --work /tmp/bench_shards

Each fill runs in its own process (`--fill`), which reports its peak RSS (ru_maxrss): copying the caches into the
index's arrays and images.sqlite a batch at a time, training FAISS on a sample drawn across the shards, and adding
the vectors a chunk at a time. The corpus is written first, in another process, and not measured.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BACKBONE = "world:pretrained"  # the spec the corpus records; the fill never runs it (a stub stands in)


def write_corpus(root: Path, n: int, dim: int, shard: int, seed: int = 0) -> str:
    """N random unit vectors (float16) as one feature cache per shard, with done.json, corpus.json and the sample
    lists the fill reads; returns the shard pattern (the tars themselves are never read by the fill)."""
    import torch
    from foco.features import write_shard
    rng = np.random.default_rng(seed)
    names = [f"{s:05d}" for s in range(-(-n // shard))]
    feats = root / "features"
    for k, name in enumerate(names):
        rows = min(shard, n - k * shard)
        part = feats / "parts" / name
        (part / "images").mkdir(parents=True, exist_ok=True)
        x = rng.standard_normal((rows, dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        keys = [f"{k * shard + i:09d}" for i in range(rows)]
        write_shard(part / "images", 0, {"global": torch.from_numpy(x.astype(np.float16))}, keys)
        (part / "manifest.json").write_text(json.dumps({
            "backbone": BACKBONE, "embed_dim": dim, "dtype": "float16", "shard_size": shard, "precision": "fp32",
            "images": {"count": rows, "fingerprint": "0" * 16}}))
        (part / "done.json").write_text(json.dumps({"samples": rows, "texts": 0}))
        (root / "out" / "samples").mkdir(parents=True, exist_ok=True)
        (root / "out" / "samples" / f"{name}.json").write_text(json.dumps({
            "shard": f"{name}.tar", "samples": [[key, 512 * i, 40_000, "0" * 64, 256, 256, None, None]
                                                for i, key in enumerate(keys)]}))
    pattern = str(root / "shards" / f"{{00000..{len(names) - 1:05d}}}.tar")
    (feats / "corpus.json").write_text(json.dumps({"pattern": pattern, "backbone": BACKBONE, "parts": names}))
    return pattern


class Peaks:
    """The largest RssAnon (the process's own memory) and RssFile (file pages it maps: the page cache, shared and
    reclaimable, e.g. FAISS's memory-mapped inverted lists while merge_ondisk writes them) seen, sampled every
    50 ms from /proc/self/status; ru_maxrss counts both."""

    def __init__(self):
        import threading
        self.anon = self.file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
            self.anon = max(self.anon, int(fields["RssAnon"].split()[0]))
            self.file = max(self.file, int(fields["RssFile"].split()[0]))

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {"peak_anon_mb": round(self.anon / 1024, 1), "peak_file_mb": round(self.file / 1024, 1)}


def fill(root: Path, pattern: str, index_type: str, train_size: int | None, ondisk: bool) -> dict:
    from types import SimpleNamespace
    from foco.search.shards import ShardIndexConfig, fill_index
    peaks = Peaks()
    cfg = ShardIndexConfig(shards=pattern, backbone=BACKBONE, features=str(root / "features"),
                           index_type=index_type, train_size=train_size, ondisk=ondisk)
    t0 = time.time()
    stats = fill_index(cfg, root / "out", backbone=SimpleNamespace(weights_sha256=None))
    meta = json.loads((root / "out" / "index.json").read_text())
    vec = meta["vectors"]
    return {"n": stats.indexed, "seconds": round(time.time() - t0, 1), "train_s": vec["train_s"],
            "add_s": vec["add_s"], "trained_on": vec["trained_on"], "factory": vec["factory"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), **peaks.stop()}


def quantizer(nlist: int, dim: int, queries: int = 20_000, seed: int = 0) -> dict:
    """Seconds to assign `queries` vectors to `nlist` centroids: exact (IndexFlatIP, what IVF{nlist} adds
    through) and HNSW32 (IVF{nlist}_HNSW32), with the graph's build time."""
    import faiss
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((nlist, dim), dtype=np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    x = rng.standard_normal((queries, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(dim)
    flat.add(c)
    t = time.time()
    _, exact = flat.search(x, 1)
    flat_s = time.time() - t
    hnsw = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
    t = time.time()
    hnsw.add(c)
    build_s = time.time() - t
    t = time.time()
    _, approx = hnsw.search(x, 1)
    hnsw_s = time.time() - t
    return {"nlist": nlist, "dim": dim, "queries": queries, "flat_s": round(flat_s, 2),
            "flat_gflops": round(2 * queries * nlist * dim / flat_s / 1e9, 1), "hnsw_build_s": round(build_s, 2),
            "hnsw_s": round(hnsw_s, 3), "hnsw_agrees": round(float((exact == approx).mean()), 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="*", default=[])
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--shard", type=int, default=10_000, help="images per shard")
    p.add_argument("--work", required=True)
    p.add_argument("--index-type", default="IVF1024,Flat")
    p.add_argument("--train-size", type=int, default=40_960)
    p.add_argument("--ondisk", action="store_true", help="IVF lists on disk (FAISS merge_ondisk)")
    p.add_argument("--quantizer", type=int, nargs="*", default=[], help="nlist values to time assignment at")
    p.add_argument("--fill", default=None, help=argparse.SUPPRESS)  # the child: a written corpus's folder
    a = p.parse_args()
    if a.fill:
        root = Path(a.fill)
        pattern = json.loads((root / "features" / "corpus.json").read_text())["pattern"]
        print(json.dumps(fill(root, pattern, a.index_type, a.train_size, a.ondisk)))
        return 0
    for n in a.n:
        root = Path(a.work) / f"n{n}"
        shutil.rmtree(root, ignore_errors=True)
        t = time.time()
        write_corpus(root, n, a.dim, a.shard)
        written = time.time() - t
        r = subprocess.run([sys.executable, __file__, "--work", a.work, "--fill", str(root), "--index-type",
                            a.index_type, "--train-size", str(a.train_size), *(["--ondisk"] if a.ondisk else [])],
                           capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        rec = json.loads(r.stdout.strip().splitlines()[-1])
        rec["corpus_write_s"] = round(written, 1)
        rec["vectors_fp32_mb"] = round(n * a.dim * 4 / 2 ** 20, 1)
        print(json.dumps(rec), flush=True)
        shutil.rmtree(root, ignore_errors=True)
    for nlist in a.quantizer:
        print(json.dumps(quantizer(nlist, a.dim)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
