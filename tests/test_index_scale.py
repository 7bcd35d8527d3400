"""The index at scale: features in on-disk arrays, a FAISS index trained on a sample and filled a chunk at a time,
on-disk inverted lists, updates without retraining, memory-mapped read-only loading, and the rules of
`--index-type auto`. Synthetic vectors, written through the same store a build writes."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from foco.search import vectors as V  # noqa: E402
from foco.search.store import ImageRow, ImageStore  # noqa: E402


def _clustered(n: int, dim: int, seed: int, centres: int = 16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, dim)).astype(np.float32)
    x = c[rng.integers(0, centres, n)] + 0.3 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _rows(names):
    return [ImageRow(0, f"{p}.png", 1, 1, hashlib.sha256(p.encode()).hexdigest(), 8, 8) for p in names]


def _fill(folder, x, start=0, batch=500):
    with ImageStore(folder / "images.sqlite") as store:
        for s in range(0, len(x), batch):
            store.add(_rows([f"img{start + i}" for i in range(s, min(s + batch, len(x)))]), x[s:s + batch])


def _exact(store, q, k):
    ids, vecs = [], []
    for i, s in store.live():
        ids.append(i)
        vecs.append(store.vectors.read(s))
    ids, vecs = np.concatenate(ids), np.concatenate(vecs)
    return ids[np.argsort(-(q @ vecs.T), axis=1, kind="stable")[:, :k]]


@pytest.mark.parametrize("ondisk", [False, True])
def test_ivf_is_built_from_the_arrays_updated_without_retraining_and_loaded_mapped(tmp_path, ondisk):
    x = _clustered(3000, 32, 0)
    _fill(tmp_path, x)
    with ImageStore(tmp_path / "images.sqlite") as store:
        rec = V.build_faiss(store, tmp_path, V.VectorConfig("IVF16,Flat", ondisk=ondisk, train_size=1000))
    assert rec["trained_on"] == 1000 and rec["nlist"] == 16 and rec["ondisk"] == ondisk
    trained = (tmp_path / "trained.faiss").read_bytes()
    index = V.load_vector_index(tmp_path / "vectors.faiss", ivf=True, ondisk=ondisk)
    assert not hasattr(index, "id_map")  # an IVF index keeps the ids itself: no IndexIDMap2 around it
    V.set_search_params(index, nprobe=16)  # every list: exact
    q = _clustered(20, 32, 1)
    with ImageStore(tmp_path / "images.sqlite", readonly=True) as store:
        assert np.array_equal(V.search_vectors(index, q, 10)[1], _exact(store, q, 10))

    # an update: 400 new images, 300 removed, 50 replaced by new content
    _fill(tmp_path, _clustered(400, 32, 2), start=3000)
    with ImageStore(tmp_path / "images.sqlite") as store:
        gone = store.remove([f"img{i}.png" for i in range(300)])
        store.add(_rows([f"img{i}" for i in range(300, 350)]), _clustered(50, 32, 3))
        rec = V.update_faiss(store, tmp_path, rec)
        assert store.removed() == []
    assert (tmp_path / "trained.faiss").read_bytes() == trained  # not retrained
    assert rec["count"] == 3100 and rec["trained_on"] == 1000
    index = V.load_vector_index(tmp_path / "vectors.faiss", ivf=True, ondisk=ondisk)
    V.set_search_params(index, nprobe=16)
    assert index.ntotal == 3100
    with ImageStore(tmp_path / "images.sqlite", readonly=True) as store:
        got = V.search_vectors(index, q, 10)[1]
        assert np.array_equal(got, _exact(store, q, 10))
        assert not set(got.ravel().tolist()) & set(gone)
    if ondisk:
        assert len(list(tmp_path.glob("lists-*.ivfdata"))) == 1  # the previous lists are gone


def test_a_kill_between_the_arrays_and_the_commit_is_cut_back(tmp_path):
    x = _clustered(100, 8, 0)
    _fill(tmp_path, x, batch=50)
    with ImageStore(tmp_path / "images.sqlite") as store:
        store.vectors.write(100, _clustered(30, 8, 1))  # a batch on disk whose rows were never committed
    size = (tmp_path / "vectors" / "shard-00000.f32").stat().st_size
    assert size == 130 * 8 * 4
    with ImageStore(tmp_path / "images.sqlite") as store:  # opened for writing: cut back to what was committed
        assert (tmp_path / "vectors" / "shard-00000.f32").stat().st_size == 100 * 8 * 4
        assert np.array_equal(store.vector_rows([1, 100]), x[[0, 99]])


def test_the_arrays_span_shards(tmp_path):
    from foco.search.arrays import FeatureArrays
    a = FeatureArrays(tmp_path, (3,), "float32", shard_rows=4)
    rows = np.arange(30, dtype=np.float32).reshape(10, 3)
    a.write(0, rows[:6])
    a.write(6, rows[6:])
    assert len(list(tmp_path.glob("shard-*.f32"))) == 3
    assert np.array_equal(a.read([9, 0, 4, 3]), rows[[9, 0, 4, 3]])
    a.truncate(5)
    assert [p.stat().st_size for p in sorted(tmp_path.glob("shard-*.f32"))] == [4 * 12, 12]


def test_a_flat_and_an_hnsw_index_update_and_load_mapped(tmp_path):
    for factory in ("Flat", "HNSW16"):
        d = tmp_path / factory
        d.mkdir()
        _fill(d, _clustered(600, 16, 0))
        with ImageStore(d / "images.sqlite") as store:
            rec = V.build_faiss(store, d, V.VectorConfig(factory))
            store.remove([f"img{i}.png" for i in range(100)])
            rec = V.update_faiss(store, d, rec)
        index = V.load_vector_index(d / "vectors.faiss", ivf=False)
        assert index.ntotal == 500
        ids = V.search_vectors(index, _clustered(5, 16, 1), 20)[1]
        assert (ids > 100).all()


def test_auto_chooses_by_the_written_rules():
    assert V.choose_index(5_000, 768, V.parse_bytes("4GB"))[0] == "Flat"
    assert V.choose_index(1_000_000, 768, V.parse_bytes("4GB"))[0] == "Flat"  # 3.1 GB fits
    # above 1M: an HNSW coarse quantizer (issue 43), its lists at most n / 39, a power of two
    assert V.choose_index(2_000_000, 768, V.parse_bytes("8GB"))[0] == "IVF32768_HNSW32,Flat"
    assert V.choose_index(100_000_000, 768, V.parse_bytes("8GB"))[0] == "IVF262144_HNSW32,PQ64"
    assert V.choose_index(100_000_000, 768, V.parse_bytes("3GB"))[0] == "IVF262144_HNSW32,PQ24"  # 3.2e9 B <= 3 GiB
    with pytest.raises(ValueError, match="raise it"):
        V.choose_index(100_000_000, 768, V.parse_bytes("1GB"))
    assert V.nlist_for(1_000_000) == 4096 and V.nlist_for(1000) == 25
    assert V.default_train_size("IVF4096,Flat", 10**8, 768) == 64 * 4096
    assert V.default_train_size("IVF64,PQ16", 10**8, 768) == 39 * 256
    assert V.default_train_size("IVF16384,PQ64", 10**9, 768) == V.MAX_TRAIN_BYTES // (4 * 768)  # 42 a list
    # the cap never leaves fewer than FAISS's 39 vectors a centroid (1M lists could not be trained under it)
    assert V.default_train_size("IVF65536_HNSW32,PQ64", 10**9, 768) == 39 * 65536
    assert V.default_train_size("IVF1048576_HNSW32,PQ32", 10**9, 768) == 39 * 2 ** 20
    with pytest.raises(ValueError, match="--max-index-memory"):
        V.parse_bytes("lots")


def test_auto_takes_an_hnsw_quantizer_at_the_faiss_guideline_sizes():
    """FAISS's "Guidelines to choose an index": IVF65536_HNSW32 for 1M-10M vectors, IVF262144_HNSW32 for 10M-100M,
    IVF1048576_HNSW32 for 100M-1B; below 1M, IVF with a flat quantizer of about 4 sqrt(N) lists."""
    big = V.parse_bytes("1024TB")  # room for IVF-Flat: the quantizer alone is compared
    for n, want in ((5_000_000, "IVF65536_HNSW32,Flat"), (50_000_000, "IVF262144_HNSW32,Flat"),
                    (500_000_000, "IVF1048576_HNSW32,Flat"), (999_000_000, "IVF1048576_HNSW32,Flat")):
        assert V.choose_index(n, 768, big)[0] == want, n
    assert V.choose_index(5_000_000, 768, V.parse_bytes("4GB"))[0] == "IVF65536_HNSW32,PQ64"
    assert V.choose_index(500_000_000, 768, V.parse_bytes("16GB"))[0] == "IVF1048576_HNSW32,PQ24"
    assert V.choose_index(200_000, 768, V.parse_bytes("100MB"))[0] == "IVF2048,PQ64"  # flat quantizer below 1M
    assert V.coarse_quantizer(1_000_000) == "IVF4096" and V.coarse_quantizer(1_000_001) == "IVF16384_HNSW32"


def test_growth_is_reported_by_the_stated_rules():
    assert V.growth({"count": 3000, "nlist": 16, "trained_on": 1000, "trained_count": 3000}) is None
    msg = V.growth({"count": 200_000, "nlist": 16, "trained_on": 1000, "trained_count": 3000})
    assert "16 lists" not in msg and "66.7x the 3000" in msg and "--retrain" in msg  # 16 < 2 sqrt(3000) already
    msg = V.growth({"count": 11_000, "nlist": 256, "trained_on": 9000, "trained_count": 9000})
    assert msg is None  # 256 >= 2 sqrt(11000) = 210
    msg = V.growth({"count": 30_000, "nlist": 256, "trained_on": 9000, "trained_count": 9000})
    assert "256 lists for 30000 vectors" in msg and "x the" not in msg
    assert V.growth({"count": 200_000, "nlist": None, "trained_on": 0, "trained_count": 3000}) is None  # Flat


def test_the_cli_builds_updates_and_retrains_an_ivf_index(tiny_world, tmp_path, capsys):
    import shutil
    from foco.cli import main
    src = sorted((tiny_world / "images" / "test-single").glob("*.png"))
    photos = tmp_path / "photos"
    photos.mkdir()
    for p in src[:300]:
        shutil.copy2(p, photos / p.name)
    out = tmp_path / "index"
    assert main(["index", "build", "--images", str(photos), "--backbone", "world:pretrained", "--out", str(out),
                 "--index-type", "IVF4,Flat", "--train-size", "200"]) == 0
    trained = (out / "trained.faiss").read_bytes()
    for p in src[300:]:
        shutil.copy2(p, photos / p.name)
    (photos / src[0].name).unlink()
    assert main(["index", "update", str(out)]) == 0
    assert (out / "trained.faiss").read_bytes() == trained  # added to, not retrained
    import json
    meta = json.loads((out / "index.json").read_text())
    assert meta["count"] == len(src) - 1 and meta["vectors"]["count"] == len(src) - 1
    assert meta["vectors"]["trained_on"] == 200 and meta["vectors"]["factory"] == "IVF4,Flat"
    capsys.readouterr()
    assert main(["search", "--index", str(out), "--reference", "2", "--text", "a star", "--method", "sum",
                 "-k", "3", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["index", "update", str(out), "--retrain"]) == 0
    assert json.loads((out / "index.json").read_text())["vectors"]["trained_count"] == len(src) - 1
    auto = tmp_path / "auto"
    assert main(["index", "build", "--images", str(photos), "--backbone", "world:pretrained", "--out", str(auto),
                 "--index-type", "auto", "--max-index-memory", "1GB"]) == 0
    assert json.loads((auto / "index.json").read_text())["vectors"]["factory"] == "Flat"
    with pytest.raises(SystemExit):  # argparse names the flag
        main(["index", "build", "--images", str(photos), "--backbone", "world:pretrained", "--out",
              str(tmp_path / "x"), "--max-index-memory", "lots"])
    assert "--max-index-memory 'lots': give a size such as 4GB" in capsys.readouterr().err
