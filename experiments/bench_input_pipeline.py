"""Does the CPU keep a GPU fed? The input pipeline of online training and extraction, before and after issue 43.

    python experiments/bench_input_pipeline.py                       # both parts, ~2 min on 2 cores
    python experiments/bench_input_pipeline.py --part throughput --images 640 --workers 0 1 2
    python experiments/bench_input_pipeline.py --part memory --shard-sizes 200 800
    python experiments/bench_input_pipeline.py --before-src /tmp/before/src   # memory: the old extraction too
    python experiments/bench_input_pipeline.py --quick      # gpu_check.sh's step: throughput only, 256 images,
                                                            # workers 0, 2, 4, 8 (up to the cores), < 1 min

1. THROUGHPUT (online training's input, `foco.train.online.OnlinePairTable`): images/s delivered to the training
   process ready for the device, by DataLoader worker count, for 500 x 375 JPEGs in webdataset shards, at 224 px
   with CLIP ViT-L/14's image processor (shortest edge 224, bicubic, centre crop 224: `CLIPImageProcessorPil`'s
   defaults) and K = 5 pairs a caption (local captions of 8 words, contexts of 20).
   * before: the workers only decode and pickle PIL images back (a copy of the old `_Samples`); the training
     process looks the decompositions up, runs the image processor (resize, crop, rescale, normalise to fp32) and
     tokenizes the local and contextual captions (padded to the longest), as the old `OnlinePairTable.batch` did.
   * after: `OnlinePairTable.loader` as training runs it: the workers decode, resize and crop to uint8 pixels (the
     backbone's `image_transform`), look the decompositions up and tokenize at a fixed length (`text_transform`);
     the training process only receives tensors (normalisation happens on the device, inside `encode_pixels`).
   Each is timed over one epoch of `--images` images in batches of `--batch` (64: one rank's share of B = 512 on 8
   GPUs), from the loader's creation (worker start-up included) to the last batch, and compared with the GPU's
   time for one rank's step at the ViT-L/14 recipe's FLOPs at 40 % MFU (counted with `bench_scale.py`'s
   `backbone_flops` and `foco_flops`; the arithmetic is printed). The CPU time of the training process and of the
   workers (getrusage: SELF and reaped CHILDREN) is given per image: the training process's share cannot be spread
   over workers (1000 / it bounds the images/s whatever the worker count), the rest can; "cores for one GPU" is the
   GPU's images/s times the CPU seconds an image costs in all.
   The backbone is a random CLIP with ViT-L/14's processor and a tiny tower (`bench_scale.py`'s "tiny" shapes,
   224 px): only the CPU side is timed, never the towers.

2. MEMORY (extraction, `foco.corpus_features.extract_corpus`): peak RSS of a process that extracts one shard of
   n images (500 x 375 JPEGs, batch 32, image features only), at two shard sizes, in a fresh subprocess each, minus
   the same process's RSS just before extraction (imports and backbone loaded): the peak is VmHWM after resetting
   it at the start (/proc/self/clear_refs), and RSS sampled every 2 ms, whichever is larger. The old code decoded
   the whole shard before encoding (`--before-src`, a checkout of the code before issue 43, e.g. `git worktree add
   /tmp/before HEAD` made before the change); the new one streams, so its peak is per batch and does not grow with
   n. Workers' own peaks are reported apart (RUSAGE_CHILDREN).

Writes a JSON (`--out`) and prints markdown tables.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_scale  # noqa: E402  the random checkpoint, its tokenizer, the FLOP counters

H200_BF16 = 989e12  # dense bf16 peak, H100/H200 SXM (bench_scale.DENSE_PEAK)
MFU = 0.40
RANKS, PAPER_B, K = 8, 512, 5
CTX_WORDS, LOCAL_WORDS = 20, 8  # the captions of docs/benchmarks.md's FLOP count ("contexts of 20 tokens")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- data -----------------------------------------------------------------------------------------------------------

def jpeg(rng: np.random.Generator, w: int = 500, h: int = 375) -> bytes:
    """A 500 x 375 JPEG of smooth random colour (compresses like a photo, unlike white noise)."""
    from PIL import Image
    small = rng.integers(0, 256, (h // 25 + 1, w // 25 + 1, 3), dtype=np.uint8)
    im = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    noise = rng.integers(-12, 13, (h, w, 3))
    arr = np.clip(np.asarray(im, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(bench_scale.WORDS, n))


def make_shards(folder: Path, n: int, per_shard: int, seed: int = 0) -> tuple[str, list[str]]:
    from foco.corpora.webdataset import write_shards
    rng = np.random.default_rng(seed)
    base = [jpeg(rng) for _ in range(min(n, 64))]  # 64 distinct JPEGs, repeated: decoding cost is per image
    samples = [(f"{i:09d}", base[i % len(base)], ".jpg", f"{i} {words(rng, CTX_WORDS)}", {}) for i in range(n)]
    paths = write_shards(samples, folder, shard_size=per_shard)
    return f"{folder}/{{00000..{len(paths) - 1:05d}}}.tar", [s[3] for s in samples]


def make_store(path: Path, captions: list[str], seed: int = 1) -> None:
    from foco.decompose.schema import Decomposition, LocalContextPair
    from foco.decompose.store import DecompositionStore
    rng = np.random.default_rng(seed)
    with DecompositionStore(path) as store:
        sid = store.register({"name": "rule"})
        store.put_many(sid, [Decomposition(c, [LocalContextPair(words(rng, LOCAL_WORDS), words(rng, CTX_WORDS))
                                               for _ in range(K)], {"name": "rule"}) for c in captions])


# -- the GPU's budget ---------------------------------------------------------------------------------------------

def gpu_budget() -> dict:
    """One rank's share of an online stage-2 step at the ViT-L/14 recipe (B = 512 on 8 GPUs, K = 5) at 40 % MFU."""
    from transformers import CLIPConfig
    spec = bench_scale.SHAPES["vit-l-14"]
    cfg = CLIPConfig(text_config=spec["text"], vision_config=spec["vision"], projection_dim=spec["projection_dim"])
    img = bench_scale.backbone_flops(cfg, 1, [])
    ctx = bench_scale.backbone_flops(cfg, 0, [(1, CTX_WORDS)])
    loc = bench_scale.backbone_flops(cfg, 0, [(1, LOCAL_WORDS)])
    foco = bench_scale.foco_flops(PAPER_B, K, spec["projection_dim"], (224 // 14) ** 2, CTX_WORDS, True)
    encode = PAPER_B * img + PAPER_B * K * (ctx + loc)
    train = 3 * foco["fwd"]
    rate = MFU * H200_BF16
    per_rank = PAPER_B // RANKS
    out = {"image_gflop": img / 1e9, "context_gflop": ctx / 1e9, "local_gflop": loc / 1e9,
           "foco_fwd_tflop": foco["fwd"] / 1e12, "encode_tflop_step": encode / 1e12, "train_tflop_step": train / 1e12,
           "images_per_rank": per_rank, "flops_per_s": rate,
           "encode_only_s": encode / RANKS / rate, "step_s": (encode + train) / RANKS / rate}
    out["lines"] = [
        f"ViT-L/14 (bench_scale.py's counters, meta device): image tower {img / 1e9:.1f} GFLOP an image, "
        f"a {CTX_WORDS}-token context {ctx / 1e9:.2f}, an {LOCAL_WORDS}-token local caption {loc / 1e9:.2f}; "
        f"FoCo stage 2 at B = {PAPER_B}, K = {K}: {foco['fwd'] / 1e12:.2f} TFLOP forward (x 3 with backward)",
        f"encode  = {PAPER_B} x {img / 1e9:.1f} G + {PAPER_B * K} x ({ctx / 1e9:.2f} + {loc / 1e9:.2f}) G "
        f"= {encode / 1e12:.1f} TFLOP a step",
        f"train   = 3 x {foco['fwd'] / 1e12:.2f} = {train / 1e12:.1f} TFLOP a step",
        f"at {MFU:.0%} of {H200_BF16 / 1e12:.0f} TFLOP/s = {rate / 1e12:.1f} TFLOP/s, one of {RANKS} ranks "
        f"({per_rank} images): encode only {encode / RANKS / rate * 1e3:.1f} ms, "
        f"whole step {(encode + train) / RANKS / rate * 1e3:.1f} ms",
        f"images/s a rank's input pipeline must deliver: {per_rank / ((encode + train) / RANKS / rate):,.0f} "
        f"(whole step), {per_rank / (encode / RANKS / rate):,.0f} (encode only, the tighter)"]
    return out


# -- throughput ---------------------------------------------------------------------------------------------------

class OldSamples(torch.utils.data.Dataset):
    """The old `foco.train.online._Samples` (before issue 43): read and decode, hand back PIL images."""

    def __init__(self, paths, index):
        self.paths, self.index, self._fds = paths, index, {}

    def __len__(self):
        return len(self.index)

    def _read(self, shard, offset, size):
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return os.pread(fd, size, offset)

    def __getitem__(self, i):
        from PIL import Image
        shard, io_, isz, co, csz = (int(v) for v in self.index[i])
        with Image.open(io.BytesIO(self._read(shard, io_, isz))) as im:
            image = im.convert("RGB")
        return image, self._read(shard, co, csz).decode("utf-8", "replace").strip()


def old_collate(items):
    return [im for im, _ in items], [c for _, c in items]


def run_before(table, batches, workers: int) -> int:
    """The old path: decode-only workers, then the main thread's share of the old `OnlinePairTable.batch`."""
    bb = table.backbone
    loader = torch.utils.data.DataLoader(OldSamples(table.paths, table.index), batch_sampler=[b.tolist() for b in
                                         batches], num_workers=workers, collate_fn=old_collate,
                                         **({"prefetch_factor": 2} if workers else {}))
    n = 0
    for images, captions in loader:
        found = table._store.get_many(table._sid, list(dict.fromkeys(captions)))
        pairs = [found[c].pairs[:K] for c in captions]
        pixels = bb.image_processor(images=[im.convert("RGB") for im in images],
                                    return_tensors="pt")["pixel_values"]  # (B, 3, 224, 224) fp32
        bb._tokenize([p.local for ps in pairs for p in ps])
        bb._tokenize([p.context for ps in pairs for p in ps])
        n += len(pixels)
    return n


def run_after(table, batches, workers: int) -> int:
    table.workers = workers
    n = 0
    for prep in table.loader(batches):
        assert prep["pixels"].dtype == torch.uint8
        n += len(prep["pixels"])
    return n


def cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def throughput(a, root: Path, budget: dict) -> list[dict]:
    from foco.backbones.hf import HFBackbone
    from foco.train.online import OnlinePairTable
    ckpt = root / "ckpt"
    bench_scale.save_checkpoint("tiny", ckpt)
    bb = HFBackbone(str(ckpt))
    proc = bb.image_processor
    print(f"# processor: {type(proc).__name__} size={proc.size} crop={proc.crop_size} resample={proc.resample}")
    pattern, captions = make_shards(root / "shards", a.images, a.images // 2)
    make_store(root / "d.sqlite", captions)
    table = OnlinePairTable(pattern, bb, root / "d.sqlite", "rule", k=K, workers=0, device=a.device)  # CUDA: pinned
    order = torch.arange(a.images)
    batches = list(order.split(a.batch))
    run_after(table, batches[:1], 0)  # warm-up: page cache, lazy imports
    run_before(table, batches[:1], 0)
    rows = []
    for w in a.workers:
        for name, fn in (("before", run_before), ("after", run_after)):
            s0, c0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            n = fn(table, batches, w)  # an exhausted loader has joined its workers: their CPU time is counted
            dt = time.perf_counter() - t0
            main_ms = (cpu(resource.RUSAGE_SELF) - s0) / n * 1e3
            workers_ms = (cpu(resource.RUSAGE_CHILDREN) - c0) / n * 1e3
            rate = n / dt
            need = budget["images_per_rank"] / budget["step_s"]  # images/s one rank's GPU consumes
            row = {"path": name, "workers": w, "images": n, "seconds": round(dt, 2), "images_per_s": round(rate, 1),
                   "ms_per_64": round(64 / rate * 1e3, 1), "x_budget": round(64 / rate / budget["step_s"], 2),
                   "main_cpu_ms_per_image": round(main_ms, 2), "workers_cpu_ms_per_image": round(workers_ms, 2),
                   "main_bound_images_per_s": round(1e3 / main_ms, 0) if main_ms > 0 else None,
                   "cores_for_budget": round(need * (main_ms + workers_ms) / 1e3, 1),
                   "load": load()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# -- memory -------------------------------------------------------------------------------------------------------

MEM_CHILD = r"""
import json, os, resource, sys, threading, time
import torch
torch.set_num_threads(1)
from foco.backbones.hf import HFBackbone
from foco.corpus_features import extract_corpus
from foco.features import ExtractConfig
ckpt, pattern, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
bb = HFBackbone(ckpt)
PAGE = os.sysconf("SC_PAGE_SIZE")

def rss():  # bytes resident now
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE

def hwm():  # bytes, the peak since the last reset (VmHWM)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

base = rss()
try:
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS (Linux >= 4.0)
        f.write("5")
    reset = True
except OSError:
    reset = False
sampled, stop = [base], threading.Event()

def sample():
    while not stop.is_set():
        sampled.append(rss())
        time.sleep(0.002)

th = threading.Thread(target=sample, daemon=True)
th.start()
t0 = time.perf_counter()
extract_corpus(bb, pattern, out, cfg=ExtractConfig(patches=False, batch_size=32), decompositions=None,
               workers=workers)
dt = time.perf_counter() - t0
stop.set()
th.join()
peak = max(max(sampled), hwm() if reset else 0)
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"base_mb": base / 2**20, "peak_mb": peak / 2**20, "workers_peak_mb": kids / 2**20,
                  "hwm_reset": reset, "seconds": dt}))
"""


def memory(a, root: Path) -> list[dict]:
    ckpt = root / "ckpt"
    if not (ckpt / "config.json").is_file():
        bench_scale.save_checkpoint("tiny", ckpt)
    sources = [("after", str(HERE.parent / "src"))] + ([("before", a.before_src)] if a.before_src else [])
    rows = []
    for n in a.shard_sizes:
        pattern, _ = make_shards(root / f"mem{n}", n, n, seed=n)
        for name, src in sources:
            for w in a.mem_workers:
                out = root / f"out-{name}-{n}-{w}"
                env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
                r = subprocess.run([sys.executable, "-c", MEM_CHILD, str(ckpt), pattern, str(out), str(w)], env=env,
                                   capture_output=True, text=True, timeout=900)
                if r.returncode:
                    raise SystemExit(f"memory child failed ({name}, n={n}):\n{r.stderr[-3000:]}")
                m = json.loads(r.stdout.strip().splitlines()[-1])
                row = {"code": name, "shard_images": n, "workers": w, "batch": 32,
                       "extraction_peak_mb": round(m["peak_mb"] - m["base_mb"], 1), "process_peak_mb":
                       round(m["peak_mb"], 1), "workers_peak_mb": round(m["workers_peak_mb"], 1),
                       "hwm_reset": m["hwm_reset"], "seconds": round(m["seconds"], 1), "load": load()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# -- main ---------------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("all", "throughput", "memory"), default="all")
    ap.add_argument("--quick", action="store_true",
                    help="throughput only, 256 images, workers 0, 2, 4 and 8 up to the machine's cores")
    ap.add_argument("--images", type=int, default=640, help="images an epoch (throughput)")
    ap.add_argument("--batch", type=int, default=64, help="images a batch: one rank's share of B = 512 on 8 GPUs")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--shard-sizes", type=int, nargs="+", default=[200, 800])
    ap.add_argument("--mem-workers", type=int, nargs="+", default=[0, 2], help="worker counts (memory part)")
    ap.add_argument("--before-src", default=None, help="the src/ folder of the code before issue 43 (memory part)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="the training device the loader prepares for (cuda: pinned batches, the pinning counted in "
                         "the training process's CPU time); nothing is encoded")
    ap.add_argument("--out", default="runs/bench_input_pipeline.json")
    a = ap.parse_args(argv)
    if a.quick:
        cores = os.cpu_count() or 1
        a.part, a.images = "throughput", 256
        a.workers = [w for w in (0, 2, 4, 8) if w <= cores] if cores >= 2 else [0, 1]
    torch.set_num_threads(a.threads)
    import transformers
    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": a.device,
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "load_start": load()}
    print("#", json.dumps(info))
    result: dict = {"machine": info}
    budget = gpu_budget()
    result["budget"] = {k: v for k, v in budget.items() if k != "lines"}
    print("\n".join("# " + line for line in budget["lines"]))
    with tempfile.TemporaryDirectory(prefix="bench_input_") as tmp:
        root = Path(tmp)
        if a.part in ("all", "throughput"):
            result["throughput"] = throughput(a, root, budget)
        if a.part in ("all", "memory"):
            result["memory"] = memory(a, root)
    info["load_end"] = load()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    step_ms = budget["step_s"] * 1e3
    if "throughput" in result:
        print(f"\n| path | workers | images/s | ms per 64 images | x the GPU's {step_ms:.0f} ms | main process CPU "
              "ms/image | workers' CPU ms/image | main-process bound, images/s | cores for one GPU |\n"
              "|---|---|---|---|---|---|---|---|---|")
        for r in result["throughput"]:
            print(f"| {r['path']} | {r['workers']} | {r['images_per_s']} | {r['ms_per_64']} | {r['x_budget']} | "
                  f"{r['main_cpu_ms_per_image']} | {r['workers_cpu_ms_per_image']} | {r['main_bound_images_per_s']} "
                  f"| {r['cores_for_budget']} |")
    if "memory" in result:
        print("\n| code | shard images | workers | extraction peak RSS (MB) | workers' peak (MB) | s |\n"
              "|---|---|---|---|---|---|")
        for r in result["memory"]:
            print(f"| {r['code']} | {r['shard_images']} | {r['workers']} | {r['extraction_peak_mb']} | "
                  f"{r['workers_peak_mb']} | {r['seconds']} |")
    print(f"\n# load {info['load_start']} -> {info['load_end']}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
