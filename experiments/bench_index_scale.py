"""Index build and search at scale, on clustered synthetic vectors: build time, peak RSS, bytes on disk, recall@10
against exact search on held-out queries, and latency, for Flat, IVF-Flat with on-disk lists and IVF-PQ (with and
without the exact re-rank from the on-disk vectors), then a labelled projection to 100M.

    python experiments/bench_index_scale.py --n 1000000 --out /tmp/foco-ixscale          (about 10 min, 2 cores)
    OLD_SRC=<checkout of f9e435e>/src python experiments/bench_index_scale.py --n 1000000 --out /tmp/foco-ixscale

The vectors are a Gaussian mixture (`--components` centres on the unit sphere, each point a centre plus isotropic
noise of `--spread`, renormalised), so that IVF's lists have structure to find, unlike uniform random vectors.
They are written through the index's own store (`foco.search.store.ImageStore.add`, in batches, as a build writes
encoded images), and each index is built by the library function `foco index build` calls
(`foco.search.vectors.build_faiss`), in a child process of its own so that its peak RSS (VmHWM) is its own.
Searching runs in another child: the index loaded memory-mapped and read-only, as `foco serve` loads it.

With OLD_SRC, the build path before this change runs too, in a child: vectors as SQLite blobs read back whole
(`fetchall` + join), one `add_with_ids` into an IndexIDMap2 and `serialize_index`, for the same IVF-PQ index.
Results: OUT/index-scale.json and a Markdown table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


class RssSampler:
    """Peaks of this process's anonymous and file-backed resident memory (RssAnon, RssFile), sampled every 20 ms:
    VmHWM counts the page-cache pages a process maps (FAISS's mapped lists), which are shared and reclaimable; the
    anonymous peak is the memory the job itself needs."""

    def __init__(self):
        import threading
        self.anon = self.file = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _sample(self) -> None:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                self.anon = max(self.anon, int(line.split()[1]) / 1024)
            elif line.startswith("RssFile:"):
                self.file = max(self.file, int(line.split()[1]) / 1024)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def stop(self) -> dict:
        self._stop.set()
        self._t.join()
        self._sample()
        return {"peak_anon_mb": round(self.anon), "peak_file_mb": round(self.file)}


def peak_mb() -> float:
    """This process's peak resident set (VmHWM): unlike getrusage's ru_maxrss, not inherited from the parent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def mixture(n: int, dim: int, components: int, spread: float, seed: int, chunk: int = 65536):
    """Batches of the Gaussian mixture, (b, dim) float32, normalised."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((components, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for s in range(0, n, chunk):
        b = min(chunk, n - s)
        x = centres[rng.integers(0, components, b)] + spread / np.sqrt(dim) * rng.standard_normal((b, dim),
                                                                                                   dtype=np.float32)
        yield (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def write_store(a) -> dict:
    from foco.search.store import ImageRow, ImageStore
    folder = Path(a.out) / "store"
    if (folder / "done.json").is_file():
        return json.loads((folder / "done.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with ImageStore(folder / "images.sqlite") as store:
        k = 0
        for x in mixture(a.n, a.dim, a.components, a.spread, 0):
            rows = [ImageRow(0, f"synthetic/{k + i:09d}.jpg", 1, 1, "0" * 64, 224, 224) for i in range(len(x))]
            store.add(rows, x)
            k += len(x)
    info = {"n": a.n, "dim": a.dim, "write_s": round(time.time() - t0, 1), "peak_rss_mb": round(peak_mb())}
    (folder / "done.json").write_text(json.dumps(info))
    return info


def queries_and_truth(a) -> tuple[np.ndarray, np.ndarray]:
    """Held-out queries from the same mixture (another seed of the noise, the same centres) and their exact top 10,
    by a chunked exact scan of the stored vectors."""
    out = Path(a.out)
    if (out / "truth.npy").is_file():
        return np.load(out / "queries.npy"), np.load(out / "truth.npy")
    from foco.search.store import ImageStore
    rng = np.random.default_rng(1)
    centres = np.random.default_rng(0).standard_normal((a.components, a.dim)).astype(np.float32)  # mixture()'s
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    q = centres[rng.integers(0, a.components, a.queries)] + a.spread / np.sqrt(a.dim) * rng.standard_normal(
        (a.queries, a.dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    best_s = np.full((a.queries, 10), -np.inf, np.float32)
    best_i = np.zeros((a.queries, 10), np.int64)
    with ImageStore(Path(a.out) / "store" / "images.sqlite", readonly=True) as store:
        for ids, slots in store.live(131072):
            s = q @ store.vectors.read(slots).T  # (Q, c)
            cat_s, cat_i = np.concatenate([best_s, s], 1), np.concatenate([best_i, np.broadcast_to(ids, s.shape)], 1)
            top = np.argsort(-cat_s, axis=1, kind="stable")[:, :10]
            best_s, best_i = np.take_along_axis(cat_s, top, 1), np.take_along_axis(cat_i, top, 1)
    np.save(out / "queries.npy", q)
    np.save(out / "truth.npy", best_i)
    return q, best_i


# --- children ---------------------------------------------------------------------------------------------------
def child_build(a) -> dict:
    from foco.search.store import ImageStore
    from foco.search.vectors import VectorConfig, build_faiss
    out = Path(a.out) / a.name
    out.mkdir(parents=True, exist_ok=True)
    sampler = RssSampler()
    t0 = time.time()
    with ImageStore(Path(a.out) / "store" / "images.sqlite") as store:
        rec = build_faiss(store, out, VectorConfig(a.factory, ondisk=a.ondisk, train_size=a.train_size))
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    return {"build_s": round(time.time() - t0, 1), "build_peak_rss_mb": round(peak_mb()), "record": rec,
            "build_rss": sampler.stop(),
            "index_bytes": sum(v for k, v in files.items() if k != "trained.faiss"), "files": files}


def child_search(a) -> dict:
    from foco.search.store import ImageStore
    from foco.search.vectors import load_vector_index, search_vectors, set_search_params
    out = Path(a.out) / a.name
    rec = json.loads((out / "build.json").read_text())["record"]
    q, truth = np.load(Path(a.out) / "queries.npy"), np.load(Path(a.out) / "truth.npy")
    base_rss = peak_mb()
    sampler = RssSampler()
    index = load_vector_index(out / "vectors.faiss", ivf=rec["nlist"] is not None, ondisk=rec["ondisk"])
    res = {"load_peak_rss_mb": round(peak_mb()), "rss_before_load_mb": round(base_rss), "by_nprobe": []}
    store = ImageStore(Path(a.out) / "store" / "images.sqlite", readonly=True)
    for nprobe in ([None] if rec["nlist"] is None else a.nprobes):
        if nprobe is not None:
            set_search_params(index, nprobe=nprobe)
        for refine in ([0] if not rec["refine"] else [0, *a.refine]):
            depth = 10 * refine if refine else 10
            t0 = time.time()
            _, ids = search_vectors(index, q, depth)
            batched = time.time() - t0
            t_ref = 0.0
            if refine:
                t1 = time.time()
                exact = np.stack([store.vector_rows(row[row >= 0]) @ qq for row, qq in zip(ids, q)])  # (Q, depth)
                ids = np.take_along_axis(ids, np.argsort(-exact, axis=1, kind="stable")[:, :10], 1)
                t_ref = time.time() - t1
            recall = float(np.mean([len(set(g[:10]) & set(t)) / 10 for g, t in zip(ids[:, :10], truth)]))
            t0 = time.time()
            for qq in q[:a.latency_queries]:  # one query at a time, as a server without batching asks
                search_vectors(index, qq[None], depth)
            single = (time.time() - t0) / a.latency_queries
            res["by_nprobe"].append({"nprobe": nprobe, "refine": refine, "recall@10": round(recall, 4),
                                     "batched_ms_per_query": round(1000 * batched / len(q), 3),
                                     "single_ms_per_query": round(1000 * single, 3),
                                     "refine_ms_per_query": round(1000 * t_ref / len(q), 3)})
    res["search_peak_rss_mb"] = round(peak_mb())
    res["search_rss"] = sampler.stop()
    return res


def child_old(a) -> dict:
    """The build path before on-disk arrays: SQLite blobs, fetchall + join, one add_with_ids, serialize."""
    import sqlite3
    import faiss
    folder = Path(a.out) / "old"
    folder.mkdir(parents=True, exist_ok=True)
    db_path = folder / "images.sqlite"
    if not (folder / "filled").is_file():
        db_path.unlink(missing_ok=True)
        db = sqlite3.connect(db_path)
        db.execute("CREATE TABLE images (id INTEGER PRIMARY KEY AUTOINCREMENT, path TEXT UNIQUE, vector BLOB)")
        k = 0
        for x in mixture(a.n, a.dim, a.components, a.spread, 0):
            with db:
                db.executemany("INSERT INTO images (path, vector) VALUES (?, ?)",
                               [(f"synthetic/{k + i:09d}.jpg", v.tobytes()) for i, v in enumerate(x)])
            k += len(x)
        db.close()
        (folder / "filled").write_text("")
    sys.path.insert(0, os.environ["OLD_SRC"])
    from foco.search.vectors import build_vector_index, save_vector_index  # the old tree's
    sampler = RssSampler()
    t0 = time.time()
    db = sqlite3.connect(db_path)
    rows = db.execute("SELECT id, vector FROM images ORDER BY id").fetchall()  # as the old ImageStore.vectors
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), a.dim)
    index = build_vector_index(ids, vecs, a.factory, 100_000)
    save_vector_index(index, folder / "vectors.faiss")
    return {"build_s": round(time.time() - t0, 1), "build_peak_rss_mb": round(peak_mb()), "build_rss": sampler.stop(),
            "index_bytes": (folder / "vectors.faiss").stat().st_size, "sqlite_bytes": db_path.stat().st_size,
            "faiss": faiss.__version__}


def run_child(a, role: str, name: str, factory: str, ondisk: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", role, "--name", name, "--factory", factory, "--out", a.out,
           "--n", str(a.n), "--dim", str(a.dim), "--components", str(a.components), "--spread", str(a.spread),
           "--nprobes", ",".join(map(str, a.nprobes)), "--refine", ",".join(map(str, a.refine)),
           "--latency-queries", str(a.latency_queries)]
    if a.train_size:
        cmd += ["--train-size", str(a.train_size)]
    if ondisk:
        cmd.append("--ondisk")
    env = dict(os.environ)
    if role != "old":
        env["PYTHONPATH"] = str(HERE.parent / "src")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{role} {name} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--components", type=int, default=2000, help="mixture components (clusters)")
    p.add_argument("--spread", type=float, default=1.0, help="noise norm around each centre, before renormalising")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--nlist", type=int, default=1024, help="IVF lists of the IVF indexes")
    p.add_argument("--pq", type=int, default=64, help="PQ bytes per vector")
    p.add_argument("--nprobes", type=lambda v: [int(x) for x in v.split(",")], default=[8, 32, 64, 128])
    p.add_argument("--refine", type=lambda v: [int(x) for x in v.split(",")], default=[10, 30, 100],
                   help="IVF-PQ: shortlist factors re-ranked exactly from the on-disk vectors")
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--latency-queries", type=int, default=200)
    p.add_argument("--configs", default="flat,ivf-flat-ondisk,ivf-pq")
    p.add_argument("--out", default="/tmp/foco-ixscale")
    p.add_argument("--child", default=None)
    p.add_argument("--name", default=None)
    p.add_argument("--factory", default=None)
    p.add_argument("--ondisk", action="store_true")
    a = p.parse_args()
    if a.child:
        print(json.dumps({"build": child_build, "search": child_search, "old": child_old}[a.child](a)))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE.parent / "src"))
    results = {"args": {k: v for k, v in vars(a).items() if not k.startswith("child")},
               "store": write_store(a), "configs": {}}
    print(f"store: {results['store']}", file=sys.stderr)
    queries_and_truth(a)
    configs = {"flat": ("Flat", False), "ivf-flat-ondisk": (f"IVF{a.nlist},Flat", True),
               "ivf-pq": (f"IVF{a.nlist},PQ{a.pq}", False)}
    for name in a.configs.split(","):
        factory, ondisk = configs[name]
        b = run_child(a, "build", name, factory, ondisk)
        (out / name / "build.json").write_text(json.dumps(b))
        s = run_child(a, "search", name, factory, ondisk)
        results["configs"][name] = {"factory": factory, "ondisk": ondisk, **b, **s}
        print(f"{name}: {json.dumps(results['configs'][name])}", file=sys.stderr)
    if os.environ.get("OLD_SRC"):
        results["old_ivf_pq"] = run_child(a, "old", "old", f"IVF{a.nlist},PQ{a.pq}")
    elif (out / "old.json").is_file():  # an earlier run's old path, on the same store
        results["old_ivf_pq"] = json.loads((out / "old.json").read_text())
    if "old_ivf_pq" in results:
        (out / "old.json").write_text(json.dumps(results["old_ivf_pq"]))
    (out / "index-scale.json").write_text(json.dumps(results, indent=2))
    fp32 = a.n * a.dim * 4
    print(f"\n{a.n:,} x {a.dim} clustered vectors ({a.components} components); fp32 matrix {fp32 / 1e9:.2f} GB\n")
    print("| index | build | peak RSS (build): all, anonymous | on disk (index) | nprobe | re-rank | recall@10 | "
          "ms/query batched | ms/query one at a time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, c in results["configs"].items():
        for r in c["by_nprobe"]:
            print(f"| {c['factory']}{' on disk' if c['ondisk'] else ''} | {c['build_s']} s | "
                  f"{c['build_peak_rss_mb']}, {c['build_rss']['peak_anon_mb']} MB | {c['index_bytes'] / 1e6:.0f} MB | {r['nprobe'] or '-'} | "
                  f"{'x' + str(r['refine']) if r['refine'] else '-'} | {r['recall@10']:.3f} | "
                  f"{r['batched_ms_per_query'] + r['refine_ms_per_query']:.3f} | {r['single_ms_per_query']:.3f} |")
    if "old_ivf_pq" in results:
        o = results["old_ivf_pq"]
        print(f"| old path, IVF{a.nlist},PQ{a.pq} (SQLite blobs) | {o['build_s']} s | {o['build_peak_rss_mb']}, "
              f"{o.get('build_rss', {}).get('peak_anon_mb', '-')} MB | "
              f"{o['index_bytes'] / 1e6:.0f} MB | | | | | |")


if __name__ == "__main__":
    main()
