"""The vector index of `foco index`: FAISS (faiss-cpu, `pip install foco[search]`) over L2-normalised global
features, inner product = cosine, built from the on-disk feature arrays (`arrays.py`) in bounded memory.

`factory` is any FAISS index-factory string: "Flat" (exact, the default), "IVF1024,Flat", "HNSW32",
"IVF1024,PQ64", ..., or "auto" (`choose_index`: the rules below, within a memory budget). Ids are the image
store's ids: IVF indexes store them in their inverted lists; Flat and HNSW sit inside an IndexIDMap2.

Building (`build_faiss`):
- An index that needs training is trained on `train_size` vectors drawn at random from the arrays
  (`default_train_size`: FAISS's k-means wants 39 to 256 vectors per centroid; PQ's 256-centroid codebooks want
  at least 9,984), then the vectors are added in chunks read from the arrays: nothing corpus-sized is in memory
  but the index itself.
- `ondisk` (IVF only): each chunk is added to an empty copy of the trained index and written out as a block; the
  blocks are merged into one inverted-list file (`lists-N.ivfdata`, FAISS's `merge_ondisk`), which the index file
  refers to. The RAM of the build and of the server is then the coarse quantizer and a chunk.
- Every index is written to a temporary name and renamed into place, so a reader sees the old or the new one.

GPUs (`VectorConfig.gpu`, the build's device being CUDA, and `faiss-gpu` seeing one: `use_gpu`): an IVF index's
k-means assigns through an exact index on every GPU (`faiss.index_cpu_to_all_gpus`, its `clustering_index`), and
each chunk's vectors are assigned to their lists on the GPUs and added to the CPU index with those lists
(`add_preassigned`). The index itself never leaves the CPU, so what is written is a CPU index. On the CPU an HNSW
coarse quantizer is trained through an exact CPU index too (its graph is built once, from the centroids).

Updating (`update_faiss`): ids removed since the last write (the store's `removed` table) are taken out and rows
added since (ids above the index's last one) are put in, with the trained quantizer as it is; retraining happens
only on request. HNSW cannot remove vectors (FAISS), so its graph is rebuilt from the arrays (it has nothing to
train); on-disk lists are rewritten from the arrays with the trained quantizer (an add pass, no k-means).

Loading (`load_vector_index`): memory-mapped and read-only (IO_FLAG_MMAP | IO_FLAG_READ_ONLY), so several server
processes share one copy in the page cache. `ExactIndex` (`foco.index`) is the slow, obvious twin that tests check
the flat index against.

Index choice within a budget (`choose_index`, from FAISS's "Guidelines to choose an index" and the rules autofaiss
applies; autofaiss itself pins numpy < 2 and does not install beside foco's dependencies):
1. nlist = the power of two nearest 4 sqrt(N) (the guideline's 4-16 sqrt(N)) up to 1M vectors, with a flat
   coarse quantizer (IVF{nlist}); above 1M the guideline's HNSW coarse quantizer, IVF65536_HNSW32 to 10M,
   IVF262144_HNSW32 to 100M, IVF1048576_HNSW32 beyond (`coarse_quantizer`); at most N / 39 lists;
2. fewer than 10,000 vectors, or an exact index that fits the budget with N <= 1M: Flat;
3. else {quantizer},Flat when N x (4 D + 8) bytes fit;
4. else {quantizer},PQ{m} with the largest m in 64, 48, 32, 24, 16, 8 that divides D and whose N x (m + 8) bytes
   fit; a PQ index is searched with an exact re-rank of a shortlist of refine x k from the arrays (FAISS's refine
   step, done from disk: `--refine`, REFINE_PQ by default).
"""
from __future__ import annotations

import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..utils.progress import Bar

ADD_CHUNK = 1 << 16  # vectors read from the arrays per add: 0.2 GB at 768-d float32 (larger adds are no faster)
MAX_TRAIN_BYTES = 2 << 30  # a default training sample never holds more than this
PQ_MS = (64, 48, 32, 24, 16, 8)
REFINE_PQ = 30  # a PQ index's default shortlist factor: recall@10 0.95 at 1M clustered vectors (docs/benchmarks.md)


def _faiss():
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("the image index needs FAISS: pip install 'foco[search]' (faiss-cpu)") from exc
    return faiss


MAX_BYTES = 2 ** 50  # the largest --max-index-memory: 1,024 TB


def parse_bytes(value: str) -> int:
    """"4GB", "512MB", "1.5G", "1000000" -> bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", str(value), re.IGNORECASE)
    if not m:
        raise ValueError(f"--max-index-memory {value!r}: give a size such as 4GB or 512MB")
    size = float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")
    if not math.isfinite(size) or size > MAX_BYTES:
        raise ValueError(f"--max-index-memory {value!r}: at most {MAX_BYTES // 1024 ** 4} TB")
    if size < 1024 ** 2:
        raise ValueError(f"--max-index-memory {value!r}: at least 1MB (no index fits in less)")
    return int(size)


# FAISS's "Guidelines to choose an index" (github.com/facebookresearch/faiss/wiki/Guidelines-to-choose-an-index):
# above 1M vectors an IVF index takes an HNSW coarse quantizer with these list counts, by collection size
HNSW_BANDS = ((100_000_000, 1 << 20), (10_000_000, 1 << 18), (1_000_000, 1 << 16))  # (more than n, nlist)
MIN_PER_LIST = 39  # FAISS's k-means warns below 39 training vectors per centroid


def nlist_for(n: int) -> int:
    """Inverted lists for n vectors: the power of two nearest 4 sqrt(n) up to 1M vectors, and above that FAISS's
    guideline for an HNSW coarse quantizer (65,536 lists to 10M, 262,144 to 100M, 1,048,576 beyond); at most
    n / 39 (FAISS's minimum of 39 training vectors per centroid; above 1M, the power of two below it), at least 1."""
    if n < MIN_PER_LIST:
        return 1
    band = next((k for lo, k in HNSW_BANDS if n > lo), None)
    target = band or 2 ** round(math.log2(4 * math.sqrt(n)))
    cap = n // MIN_PER_LIST
    return max(1, target if target <= cap else (2 ** int(math.log2(cap)) if band else cap))


def coarse_quantizer(n: int) -> str:
    """The factory's IVF part for n vectors: IVF{nlist} (a flat quantizer) up to 1M vectors, IVF{nlist}_HNSW32
    above (FAISS's guideline: assigning a vector to one of 65k-1M centroids exactly costs nlist x D flops an add
    and a search, the HNSW graph a few hundred distances)."""
    nlist = nlist_for(n)
    return f"IVF{nlist}_HNSW32" if n > HNSW_BANDS[-1][0] else f"IVF{nlist}"


def choose_index(n: int, dim: int, max_bytes: int) -> tuple[str, str]:
    """The factory string `auto` picks for n vectors of `dim` within `max_bytes`, and why (module docstring)."""
    ivf = coarse_quantizer(n)
    flat = n * (4 * dim + 8)
    if n < 10_000 or (flat <= max_bytes and n <= 1_000_000):
        return "Flat", f"{n} vectors: exact search ({flat / 1e9:.2f} GB)"
    if flat <= max_bytes:
        return f"{ivf},Flat", f"IVF-Flat fits: {flat / 1e9:.2f} GB <= {max_bytes / 1e9:.2f} GB"
    for m in PQ_MS:
        if dim % m == 0 and n * (m + 8) <= max_bytes:
            return f"{ivf},PQ{m}", (f"IVF-Flat needs {flat / 1e9:.2f} GB > {max_bytes / 1e9:.2f} GB; PQ{m} "
                                    f"codes take {n * (m + 8) / 1e9:.2f} GB")
    raise ValueError(f"no index of {n} {dim}-d vectors fits --max-index-memory {max_bytes / 1e9:.2f} GB (PQ8 needs "
                     f"{n * 16 / 1e9:.2f} GB); raise it")


def _is_pq(factory: str) -> bool:
    return bool(re.search(r"(^|,)(PQ|OPQ|SQ)", factory))


def default_train_size(factory: str, n: int, dim: int) -> int:
    """Vectors to train `factory` on: 64 per IVF centroid (FAISS asks for 39-256), at least 9,984 for PQ's
    256-centroid codebooks, at most n, and at most MAX_TRAIN_BYTES of float32 unless that leaves fewer than 39 per
    centroid (the 1,048,576 lists above 100M vectors need 40.9M; under the cap's 699,050 at D = 768, FAISS's
    k-means could not train them at all: it needs at least one vector per centroid)."""
    m = re.search(r"IVF(\d+)", factory)
    nlist = int(m.group(1)) if m else 0
    want = 64 * nlist
    if _is_pq(factory):
        want = max(want, 39 * 256)
    cap = max(MAX_TRAIN_BYTES // (4 * dim), MIN_PER_LIST * nlist)
    return int(min(n, max(want, 1), cap))


@dataclass
class VectorConfig:
    factory: str = "Flat"  # a factory string, or "auto"
    max_index_memory: str = "4GB"  # the budget of "auto"
    train_size: int | None = None  # None: default_train_size
    ondisk: bool = False  # IVF: inverted lists in a file beside the index, memory-mapped
    refine: int | None = None  # PQ: re-rank refine x k FAISS results by the exact stored vectors (None: REFINE_PQ)
    seed: int = 0
    gpu: bool = False  # k-means and the adds' assignments on every GPU FAISS sees (`use_gpu`), where it sees one


def _new_index(factory: str, dim: int):
    faiss = _faiss()
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ValueError(f"--index-type {factory!r} is not a FAISS index-factory string FAISS accepts "
                         f"({str(exc).strip().splitlines()[-1]}); e.g. Flat, IVF1024,Flat, HNSW32, IVF1024,PQ64, "
                         "auto") from None


def _ivf(index):
    faiss = _faiss()
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def _sample(store, n: int, size: int, seed: int) -> np.ndarray:
    """`size` vectors drawn at random (without replacement) from the store's n rows, read from the arrays."""
    rng = np.random.default_rng(seed)
    take = np.sort(rng.choice(n, size, replace=False)) if size < n else np.arange(n)
    slots, seen = [], 0
    for _, s in store.live():
        lo = np.searchsorted(take, seen)
        hi = np.searchsorted(take, seen + len(s))
        slots.append(s[take[lo:hi] - seen])
        seen += len(s)
    return store.vectors.read(np.concatenate(slots) if slots else np.zeros(0, np.int64))


def use_gpu(asked: bool) -> bool:
    """Whether FAISS runs k-means and the adds' assignments on GPUs: asked (the build's device is CUDA) and FAISS
    sees a GPU (`faiss-gpu`: `pip install 'foco[search-gpu]'`; faiss-cpu sees none)."""
    if not asked:
        return False
    faiss = _faiss()
    return bool(getattr(faiss, "get_num_gpus", lambda: 0)() > 0)


def _flat_like(ivf):
    """An empty exact index of the IVF index's metric (what its k-means and its assignments compare with)."""
    faiss = _faiss()
    return faiss.IndexFlatIP(ivf.d) if ivf.metric_type == faiss.METRIC_INNER_PRODUCT else faiss.IndexFlatL2(ivf.d)


def _train(base, factory: str, n: int, size: int | None, draw, gpu: bool = False) -> int:
    """Trains `base` (when its type needs it) on `draw(k)`, k vectors of the n drawn at random (k: `size`, else
    `default_train_size`); returns k, 0 when nothing was trained. An IVF index's k-means assigns the sample to the
    centroids through an exact index (`clustering_index`): on every GPU with `gpu` (`faiss.index_cpu_to_all_gpus`),
    else on the CPU; an HNSW coarse quantizer thus never rebuilds its graph within k-means, and gets the centroids
    added once, at the end. The centroids come back into the CPU quantizer; nothing of the GPU stays in `base`."""
    if base.is_trained:
        return 0
    if n == 0:
        raise ValueError(f"--index-type {factory!r} must be trained, and the index holds no vectors yet")
    sample = draw(min(n, size or default_train_size(factory, n, base.d)))
    ivf = _ivf(base)
    clustering = None
    if ivf is not None and (gpu or not isinstance(_faiss().downcast_index(ivf.quantizer), _faiss().IndexFlat)):
        clustering = _flat_like(ivf)
        if gpu:
            clustering = _faiss().index_cpu_to_all_gpus(clustering)
        ivf.clustering_index = clustering
    try:
        base.train(np.ascontiguousarray(sample, dtype=np.float32))
    except RuntimeError as exc:
        raise ValueError(f"--index-type {factory!r} cannot be trained on {len(sample)} vectors "
                         f"({str(exc).strip().splitlines()[-1]}); use fewer lists (e.g. IVF{nlist_for(n)},Flat), "
                         "--index-type auto, or Flat for a small collection") from None
    finally:
        if clustering is not None:
            ivf.clustering_index = None  # the CPU index keeps no pointer to it (clone_index, write_index)
    return len(sample)


class _Assigner:
    """The inverted list of each vector an IVF index adds, found on every GPU: an exact index of the centroids
    (`index_cpu_to_all_gpus`), searched a chunk at a time; the vectors and their list numbers then go into the CPU
    index (`add_preassigned`), which alone is written. None of it for other indexes (`for_index`)."""

    def __init__(self, ivf):
        faiss = _faiss()
        self.ivf = ivf
        flat = _flat_like(ivf)
        flat.add(ivf.quantizer.reconstruct_n(0, ivf.nlist))
        self.gpu_index = faiss.index_cpu_to_all_gpus(flat)

    @classmethod
    def for_index(cls, index, gpu: bool) -> "_Assigner | None":
        faiss = _faiss()
        inner = faiss.downcast_index(index)
        return cls(inner) if gpu and isinstance(inner, faiss.IndexIVF) else None

    def add(self, x: np.ndarray, ids: np.ndarray, into=None) -> None:
        """Adds `x` to this assigner's index, or `into` another IVF index with the same centroids (an on-disk
        block: the centroids go to the GPUs once for all blocks)."""
        from faiss.contrib.ivf_tools import add_preassigned
        _, lists = self.gpu_index.search(x, 1)
        ids = np.ascontiguousarray(ids, dtype=np.int64)  # held here: add_preassigned keeps only a raw pointer to it
        lists = np.ascontiguousarray(lists.ravel(), dtype=np.int64)
        add_preassigned(self.ivf if into is None else _faiss().downcast_index(into), x, lists, ids)


def _add_chunk(index, x: np.ndarray, ids: np.ndarray, assigner: _Assigner | None, into: bool = False) -> None:
    """Adds a chunk to `index`: through `assigner` (on the GPUs) where there is one, `into` meaning `index` is not
    the assigner's own (a block cloned from it)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if assigner is not None:
        assigner.add(x, ids, into=index if into else None)
    else:
        index.add_with_ids(x, ids)


def _add_all(index, store, since_id: int = 0, bar_label: str = "adding vectors", gpu: bool = False) -> int:
    added = 0
    assigner = _Assigner.for_index(index, gpu)
    bar = Bar(store.count(), bar_label)
    for ids, slots in store.live(ADD_CHUNK, since_id):
        _add_chunk(index, store.vectors.read(slots), ids, assigner)
        added += len(ids)
        bar.update(len(ids))
    bar.close()
    return added


def _wrap(base):
    """IVF indexes keep ids in their lists; the others get an IndexIDMap (not IDMap2: its reverse map, which only
    `reconstruct` needs, would cost every server process 60 bytes an id)."""
    faiss = _faiss()
    return base if _ivf(base) is not None else faiss.IndexIDMap(base)


def _write(index, out: Path, name: str = "vectors.faiss") -> None:
    """Writes `index` as `out`/`name` through a temporary file: a failed write (full disk, read-only folder) leaves
    the previous file whole and is a `WriteError` naming it."""
    from ..utils.io import WriteError, unwritable_reason
    faiss = _faiss()
    tmp = out / f".{name}.{os.getpid()}.tmp"
    try:
        faiss.write_index(index, str(tmp))
        os.replace(tmp, out / name)
    except (RuntimeError, OSError) as exc:  # FAISS reports a failed write as a RuntimeError
        tmp.unlink(missing_ok=True)
        why = unwritable_reason(out) or (exc.strerror if isinstance(exc, OSError) and exc.strerror else
                                         "the disk may be full")
        raise WriteError(f"cannot write {out / name}: {why}; the previous file is intact. Free space or choose a "
                         "writable --out, then rerun the same command to resume") from None


def _write_ondisk(trained, store, out: Path, since_id: int = 0, gpu: bool = False) -> str | None:
    """Adds every row to on-disk inverted lists, a chunk at a time (module docstring); returns the lists' file."""
    faiss = _faiss()
    from faiss.contrib.ondisk import merge_ondisk
    blocks = out / ".blocks"
    shutil.rmtree(blocks, ignore_errors=True)
    blocks.mkdir()
    names = []
    bar = Bar(store.count(), "adding vectors (on-disk lists)")
    assigner = _Assigner.for_index(trained, gpu)  # the centroids on the GPUs once, for every block
    for k, (ids, slots) in enumerate(store.live(ADD_CHUNK, since_id)):
        block = faiss.clone_index(trained)
        _add_chunk(block, store.vectors.read(slots), ids, assigner, into=True)
        names.append(str(blocks / f"block-{k:05d}.index"))
        faiss.write_index(block, names[-1])
        del block
        bar.update(len(ids))
    bar.close()
    index = faiss.clone_index(trained)
    lists = None
    if names:
        lists = f"lists-{time.time_ns()}.ivfdata"
        merge_ondisk(index, names, str(out / lists))
    # no rows: the empty index keeps in-memory lists (nothing to put on disk), and loads the same way
    _write(index, out)
    shutil.rmtree(blocks, ignore_errors=True)
    for old in out.glob("lists-*.ivfdata"):  # the lists the previous index file referred to
        if old.name != lists:
            old.unlink()
    return lists


def build_faiss(store, out: str | Path, cfg: VectorConfig) -> dict:
    """Trains (when the index type needs it) and fills the index of every row of `store`; writes
    `out`/vectors.faiss (and `out`/trained.faiss, the empty trained index, for updates). Returns what index.json
    records of it."""
    faiss = _faiss()
    out = Path(out)
    n, dim = store.count(), store.dim()
    if dim is None:
        raise ValueError(f"{out}: no image is indexed yet, so there is nothing to build a vector index of")
    factory, why = cfg.factory, "given"
    if factory == "auto":
        factory, why = choose_index(n, dim, parse_bytes(cfg.max_index_memory))
    base = _new_index(factory, dim)
    if cfg.ondisk and _ivf(base) is None:
        raise ValueError(f"--ondisk needs an IVF index (inverted lists), not {factory!r}")
    t0 = time.time()
    gpu = use_gpu(cfg.gpu)
    trained_on = _train(base, factory, n, cfg.train_size, lambda k: _sample(store, n, k, cfg.seed), gpu)
    train_s = time.time() - t0
    index = _wrap(base)
    trained = faiss.clone_index(index)
    max_id = _max_id(store)
    t0 = time.time()
    if cfg.ondisk:
        lists = _write_ondisk(index, store, out, gpu=gpu)
    else:
        _add_all(index, store, gpu=gpu)
        _write(index, out)
        lists = None
    add_s = time.time() - t0
    _write(trained, out, "trained.faiss")  # after the index: an update never pairs a new quantizer with old lists
    store.clear_removed()
    return {"factory": factory, "why": why, "trained_on": trained_on, "trained_count": n, "train_s": round(train_s, 2),
            "add_s": round(add_s, 2), "gpu": gpu, "ondisk": bool(cfg.ondisk), "lists": lists, "max_id": max_id,
            "count": n,
            "nlist": int(_ivf(base).nlist) if _ivf(base) is not None else None,
            "refine": resolve_refine(factory, cfg.refine), "refine_asked": cfg.refine}


def resolve_refine(factory: str, asked: int | None) -> int:
    """The shortlist factor of the exact re-rank: what was asked, else REFINE_PQ for a PQ index and 0 (none) for an
    exact one."""
    return asked if asked is not None else (REFINE_PQ if _is_pq(factory) else 0)


def _max_id(store) -> int:
    r = store.db.execute("SELECT MAX(id) FROM images").fetchone()
    return int(r[0] or 0)


def update_faiss(store, out: str | Path, vec: dict, gpu: bool = False) -> dict:
    """Brings the index in `out` up to the store without retraining (module docstring); `vec` is what index.json
    records of the index (`build_faiss`'s answer). Returns the new record, with `growth` when the collection has
    outgrown the trained index."""
    faiss = _faiss()
    out = Path(out)
    removed = store.removed()
    trained = faiss.read_index(str(out / "trained.faiss"))
    since = int(vec["max_id"])
    gpu = use_gpu(gpu)
    if vec.get("ondisk"):
        lists = _write_ondisk(trained, store, out, gpu=gpu)  # every live row, through the trained quantizer
    elif _ivf(trained) is None:  # HNSW (or Flat): no removal in FAISS's HNSW, and nothing to train
        index = faiss.clone_index(trained)
        _add_all(index, store)
        _write(index, out)
        lists = None
    else:
        index = faiss.read_index(str(out / "vectors.faiss"))
        # ids above `since` may be in the file already, if a run died between writing it and recording it
        index.remove_ids(faiss.IDSelectorRange(since + 1, 2 ** 62))
        if removed:
            index.remove_ids(faiss.IDSelectorBatch(np.asarray(removed, dtype=np.int64)))
        _add_all(index, store, since, gpu=gpu)
        _write(index, out)
        lists = None
    store.clear_removed()
    n = store.count()
    rec = {**vec, "lists": lists, "max_id": _max_id(store), "count": n}
    rec["growth"] = growth(rec)
    return rec


def growth(vec: dict) -> str | None:
    """Whether the collection has outgrown what the index was trained for, measured against the count it held when
    it was trained: more than 4x that count, or an IVF index whose nlist met FAISS's guideline of 4-16 sqrt(N)
    lists then (with a factor 2 of slack for the rounding to a power of two: nlist >= 2 sqrt(N)) and no longer
    does (its lists grow long and search slows). None when neither."""
    n, nlist, base = int(vec["count"]), vec.get("nlist"), int(vec.get("trained_count") or 0)
    if not vec.get("trained_on") or not base:
        return None  # Flat and HNSW learn nothing from the data
    why = []
    if nlist and nlist >= 2 * math.sqrt(base) and nlist < 2 * math.sqrt(n):
        why.append(f"{nlist} lists for {n} vectors, under FAISS's 4 sqrt(N) = {4 * math.sqrt(n):.0f}")
    if n > 4 * base:
        why.append(f"{n} vectors, {n / base:.1f}x the {base} it was trained with")
    return ("; ".join(why) + "; rebuild it with `foco index update --retrain`") if why else None


def set_search_params(index, nprobe: int | None = None, ef_search: int | None = None) -> dict:
    """IVF's nprobe and HNSW's efSearch, where the index has them; returns what was set."""
    faiss = _faiss()
    done = {}
    if nprobe is not None and (ivf := _ivf(index)) is not None:
        ivf.nprobe = nprobe
        done["nprobe"] = nprobe
    inner = faiss.downcast_index(index.index) if hasattr(index, "id_map") else index
    if ef_search is not None and hasattr(inner, "hnsw"):
        inner.hnsw.efSearch = ef_search
        done["efSearch"] = ef_search
    return done


def load_vector_index(path: str | Path, ivf: bool, ondisk: bool = False):
    """The index at `path`, memory-mapped and read-only: an IVF index's lists are mapped (IO_FLAG_MMAP), on-disk
    lists are opened read-only beside the index file (IO_FLAG_ONDISK_SAME_DIR), and the codes of Flat and HNSW
    are mapped (IO_FLAG_MMAP_IFC). FAISS takes no other combination (MMAP with on-disk lists crashes)."""
    faiss = _faiss()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: rerun `foco index update` on this index")
    flags = faiss.IO_FLAG_READ_ONLY | (faiss.IO_FLAG_ONDISK_SAME_DIR if ondisk else
                                       faiss.IO_FLAG_MMAP if ivf else faiss.IO_FLAG_MMAP_IFC)
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as exc:
        raise ValueError(f"{path} is not a readable FAISS index ({str(exc).strip().splitlines()[-1]}); rerun "
                         "`foco index update --retrain` on this index to rebuild it") from None


def build_vector_index(ids: np.ndarray, vectors: np.ndarray, factory: str = "Flat", seed: int = 0):
    """An in-memory FAISS index of `vectors` (N, D) float32 (normalised) under `ids` (N,) int64: the same rules
    as `build_faiss` for vectors already in memory (tests, experiments)."""
    base = _new_index(factory, vectors.shape[1])
    n = len(vectors)
    rng = np.random.default_rng(seed)
    _train(base, factory, n, None, lambda k: vectors[np.sort(rng.choice(n, k, replace=False))] if k < n else vectors)
    index = _wrap(base)
    if len(vectors):
        index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int64))
    return index


def search_vectors(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q, D) float32 -> scores (Q, k) and ids (Q, k), best first; id -1 where fewer than k exist."""
    k = max(1, min(k, index.ntotal)) if index.ntotal else 1
    scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return scores, ids

