"""The vector index of `foco index`: FAISS (faiss-cpu, `pip install foco[search]`) over L2-normalised global
features, inner product = cosine.

`factory` is any FAISS index-factory string: "Flat" (exact, the default), "IVF1024,Flat", "HNSW32",
"IVF1024,PQ32", ... Indexes that need training are trained on a sample of at most `train_sample` vectors. Ids are
the image store's ids (an IndexIDMap2 around the factory index), so a result names its row whatever the order.
`ExactIndex` (`foco.index`) is the slow, obvious twin that tests check the flat index against.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..utils.io import atomic_write_bytes


def _faiss():
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("the image index needs FAISS: pip install 'foco[search]' (faiss-cpu)") from exc
    return faiss


def build_vector_index(ids: np.ndarray, vectors: np.ndarray, factory: str = "Flat", train_sample: int = 100_000,
                       seed: int = 0):
    """A FAISS index of `vectors` (N, D) float32 (normalised) under `ids` (N,) int64."""
    faiss = _faiss()
    n, dim = vectors.shape
    try:
        base = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ValueError(f"--index-type {factory!r} is not a FAISS index-factory string FAISS accepts "
                         f"({str(exc).strip().splitlines()[-1]}); e.g. Flat, IVF1024,Flat, HNSW32, IVF1024,PQ32") from None
    if not base.is_trained:
        if n == 0:
            raise ValueError(f"--index-type {factory!r} must be trained, and the index holds no vectors yet")
        rng = np.random.default_rng(seed)
        sample = vectors[rng.choice(n, min(n, train_sample), replace=False)] if n > train_sample else vectors
        try:
            base.train(np.ascontiguousarray(sample))
        except RuntimeError as exc:
            raise ValueError(f"--index-type {factory!r} cannot be trained on {len(sample)} vectors "
                             f"({str(exc).strip().splitlines()[-1]}); use fewer lists (e.g. IVF{max(1, n // 39)},Flat) "
                             "or Flat for a small collection") from None
    index = faiss.IndexIDMap2(base)
    if n:
        index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int64))
    return index


def set_search_params(index, nprobe: int | None = None, ef_search: int | None = None) -> dict:
    """IVF's nprobe and HNSW's efSearch on the index inside the id map, where it has them; returns what was set."""
    faiss = _faiss()
    inner = faiss.downcast_index(index.index) if hasattr(index, "id_map") else index
    done = {}
    if nprobe is not None:
        try:
            faiss.extract_index_ivf(inner).nprobe = nprobe
            done["nprobe"] = nprobe
        except RuntimeError:
            pass
    if ef_search is not None and hasattr(inner, "hnsw"):
        inner.hnsw.efSearch = ef_search
        done["efSearch"] = ef_search
    return done


def save_vector_index(index, path: str | Path) -> None:
    faiss = _faiss()
    atomic_write_bytes(path, faiss.serialize_index(index).tobytes())


def load_vector_index(path: str | Path):
    faiss = _faiss()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: rerun `foco index update` on this index")
    data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    try:
        return faiss.deserialize_index(data)
    except RuntimeError as exc:
        raise ValueError(f"{path} is not a readable FAISS index ({str(exc).strip().splitlines()[-1]}); rerun "
                         "`foco index update` on this index to rebuild it") from None


def search_vectors(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q, D) float32 -> scores (Q, k) and ids (Q, k), best first; id -1 where fewer than k exist."""
    k = max(1, min(k, index.ntotal)) if index.ntotal else 1
    scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return scores, ids
