"""`foco index build --in 'shards/{...}.tar'` (issue 43): the tiny world's pairs as webdataset shards, indexed by 2
gloo ranks under torchrun and by one process, give the same index (ids, rows, vectors to 1e-6, search results);
`foco search` works on it; a killed build resumes; --features takes an extracted corpus and refuses one of another
backbone or one missing a shard; FAISS's GPU path (k-means and assignment) runs through recording fakes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from foco.cli import main

faiss = pytest.importorskip("faiss")
BACKBONE = "world:pretrained"


@pytest.fixture(scope="module")
def shards(tiny_world, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "shards"
    assert main(["world", "export", "--world", str(tiny_world), "--format", "webdataset", "--split", "train",
                 "--out", str(out), "--shard-size", "250"]) == 0
    return str(out / "{00000..00002}.tar")


def _index(folder) -> tuple[list, np.ndarray]:
    from foco.search.store import ImageStore
    with ImageStore(folder / "images.sqlite") as store:
        rows = store.page(0, 10_000)
        return rows, store.vector_rows([r.id for r in rows])


def _fails(args: list[str], capsys, match: str) -> None:
    import re
    capsys.readouterr()
    assert main(args) != 0
    err = capsys.readouterr().err
    assert re.search(match, err), err


def _search(folder, capsys, reference="7") -> list[dict]:
    capsys.readouterr()
    assert main(["search", "--index", str(folder), "--reference", reference, "--text", "make it red", "--method",
                 "sum", "-k", "5", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow
def test_two_ranks_build_the_index_one_process_builds(shards, tmp_path, capsys):
    one = tmp_path / "one"
    assert main(["index", "build", "--in", shards, "--backbone", BACKBONE, "--out", str(one),
                 "--index-type", "IVF4,Flat", "--train-size", "200"]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    two = tmp_path / "two"
    r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "foco", "index", "build", "--in",
                        shards, "--backbone", BACKBONE, "--out", str(two), "--index-type", "IVF4,Flat",
                        "--train-size", "200", "--device", "cpu"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0: 2 of 3 shards, 2 encoded now" in r.stdout and "rank 1: 1 of 3 shards, 1 encoded now" in r.stdout
    assert "600 images indexed" in r.stdout
    rows1, v1 = _index(one)
    rows2, v2 = _index(two)
    assert len(rows1) == 600 and rows1 == rows2  # the same ids, names, sizes, hashes
    assert rows1[0].path == "00000.tar#000000000" and rows1[-1].path == "00002.tar#000000599"
    np.testing.assert_allclose(v1, v2, atol=1e-6, rtol=0)
    meta1, meta2 = (json.loads((f / "index.json").read_text()) for f in (one, two))
    assert meta1["source"] == meta2["source"] == "shards" and meta1["vectors"]["factory"] == "IVF4,Flat"
    hits1, hits2 = _search(one, capsys), _search(two, capsys)
    assert [h["id"] for h in hits1] == [h["id"] for h in hits2] and len(hits1) == 5
    assert [h["score"] for h in hits1] == pytest.approx([h["score"] for h in hits2], abs=1e-6)
    assert all(h["path"].split("#")[0] in ("00000.tar", "00001.tar", "00002.tar") and h["caption"] for h in hits1)
    # an indexed reference whose patches FoCo-like methods need is read back from its tar shard
    from foco.search.engine import SearchEngine
    engine = SearchEngine.open(two)
    row = engine.row(7)
    assert engine._row_image(row).size == (row.width, row.height)
    _fails(["index", "update", str(two)], capsys, "built from webdataset shards.*foco index build --in")


@pytest.mark.slow
def test_a_killed_build_resumes_to_the_same_index(shards, tmp_path, monkeypatch, capsys):
    ref = tmp_path / "ref"
    assert main(["index", "build", "--in", shards, "--backbone", BACKBONE, "--out", str(ref)]) == 0
    out = tmp_path / "out"
    from foco.search import shards as S
    from foco.search.store import ImageStore
    monkeypatch.setattr(S, "FILL_ROWS", 100)
    real, calls = ImageStore.append, []

    def dies(self, *args, **kwargs):
        if len(calls) == 4:
            raise KeyboardInterrupt("killed")
        calls.append(1)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(ImageStore, "append", dies)
    assert main(["index", "build", "--in", shards, "--backbone", BACKBONE, "--out", str(out)]) != 0
    assert json.loads((out / "index.json").read_text())["building"] is True
    monkeypatch.setattr(ImageStore, "append", real)
    (out / "features" / "parts" / "00002" / "done.json").unlink()  # as if killed while encoding shard 2 too
    capsys.readouterr()
    assert main(["index", "build", "--in", shards, "--backbone", BACKBONE, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 of 3 shards, 1 encoded now" in printed  # shard 2 again, as if killed while encoding it
    assert "250 added now" in printed and "350 already indexed" in printed  # shard 0 and 100 rows of shard 1 kept
    (rows_ref, v_ref), (rows, v) = _index(ref), _index(out)
    assert rows == rows_ref
    np.testing.assert_allclose(v, v_ref, atol=1e-6, rtol=0)
    assert _search(out, capsys) == _search(ref, capsys)
    assert main(["index", "build", "--in", shards, "--backbone", BACKBONE, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 encoded now, 0 sample lists read now" in printed and "0 added now" in printed  # nothing left to do


@pytest.mark.slow
def test_features_are_taken_as_extracted_and_checked(shards, tmp_path, capsys):
    feats = tmp_path / "feats"
    assert main(["features", "extract", "--backbone", BACKBONE, "--in", shards, "--out", str(feats)]) == 0
    built = tmp_path / "built"
    assert main(["index", "build", "--in", shards, "--backbone", BACKBONE, "--out", str(built)]) == 0
    given = tmp_path / "given"
    capsys.readouterr()
    assert main(["index", "build", "--features", str(feats), "--in", shards, "--backbone", BACKBONE, "--out",
                 str(given)]) == 0
    assert "0 encoded now" in capsys.readouterr().out  # the corpus's features, as extracted
    (rows_b, v_b), (rows_g, v_g) = _index(built), _index(given)
    assert rows_b == rows_g
    np.testing.assert_allclose(v_g, v_b, atol=1e-6, rtol=0)
    _fails(["index", "build", "--features", str(feats), "--backbone", "world:vit", "--out", str(tmp_path / "x")],
           capsys, r"corpus\.json: its features were extracted with backbone 'world:pretrained', not --backbone "
                   r"'world:vit'.*give --backbone world:pretrained")
    fewer = tmp_path / "fewer"
    assert main(["features", "extract", "--backbone", BACKBONE, "--in", shards.replace("00002", "00001"), "--out",
                 str(fewer)]) == 0
    _fails(["index", "build", "--features", str(fewer), "--in", shards, "--backbone", BACKBONE, "--out",
            str(tmp_path / "y")], capsys, r"holds no features of 1 of the 3 shards .* e\.g\. 00002; extract them")


def _store(tmp_path, n=3000, d=32):
    from foco.search.store import ImageRow, ImageStore
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((20, d))
    x = (centers[rng.integers(0, 20, n)] + 0.3 * rng.standard_normal((n, d))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    store = ImageStore(tmp_path / "images.sqlite")
    store.append([ImageRow(0, f"s.tar#{i:06d}", 1, 0, "0" * 64, 1, 1) for i in range(n)], x)
    return store, x


@pytest.mark.parametrize("factory", ["IVF16,Flat", "IVF16_HNSW32,Flat",
                                     pytest.param("IVF16_HNSW32,PQ4x4", marks=pytest.mark.slow)])
def test_the_gpu_path_trains_and_assigns_on_the_gpus_and_writes_a_cpu_index(factory, tmp_path, monkeypatch):
    """Without a GPU: get_num_gpus and index_cpu_to_all_gpus are recording fakes (the 'GPU' index is a CPU one);
    k-means goes through the GPU clustering index, every add through the GPU assignment, and what is written is
    the CPU index, never an object the GPU function returned."""
    from foco.search import vectors as V
    (tmp_path / "cpu").mkdir()
    (tmp_path / "gpu").mkdir()
    store, x = _store(tmp_path)
    cpu = V.build_faiss(store, tmp_path / "cpu", V.VectorConfig(factory, train_size=1000, gpu=True))
    assert cpu["gpu"] is False  # asked, but faiss-cpu sees no GPU
    moved, written = [], []

    def to_gpus(index, co=None, ngpu=-1):
        moved.append(index)
        return index  # the fake 'GPU' index: FAISS's own CPU index of the same contents
    real_write = faiss.write_index
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", to_gpus)
    monkeypatch.setattr(faiss, "write_index", lambda index, path: (written.append(index), real_write(index, path)))
    assert V.build_faiss(store, tmp_path / "gpu", V.VectorConfig(factory, train_size=1000, gpu=False))["gpu"] is False
    assert moved == []  # not asked (a CPU device): FAISS's GPUs are left alone
    written.clear()
    rec = V.build_faiss(store, tmp_path / "gpu", V.VectorConfig(factory, train_size=1000, gpu=True))
    assert rec["gpu"] is True and len(moved) == 2  # the k-means clustering index, then the centroids to assign to
    assert moved[0].ntotal == 16 or moved[0].ntotal == 0  # trained into (k-means), then the 16 centroids
    assert moved[1].ntotal == 16
    assert written and all(all(w is not m for m in moved) for w in written)
    assert all(not type(faiss.downcast_index(w)).__name__.startswith("Gpu") for w in written)
    ivf = faiss.extract_index_ivf(faiss.read_index(str(tmp_path / "gpu" / "vectors.faiss")))
    assert ivf.ntotal == len(x) and ivf.clustering_index is None  # nothing of the GPU kept in the index
    a = faiss.read_index(str(tmp_path / "cpu" / "vectors.faiss"))
    b = faiss.read_index(str(tmp_path / "gpu" / "vectors.faiss"))
    for index in (a, b):
        V.set_search_params(index, nprobe=16)  # every list: exact over what each index holds
    ids_a, ids_b = V.search_vectors(a, x[:50], 10)[1], V.search_vectors(b, x[:50], 10)[1]
    if "PQ" not in factory:  # exact vectors: each its own nearest (ids count from 1)
        assert (ids_a[:, 0] == np.arange(1, 51)).all() and (ids_b[:, 0] == np.arange(1, 51)).all()
    assert (ids_a == ids_b).mean() > 0.95  # the same centroids, the same lists: the same index
    store.close()


def test_on_disk_blocks_share_one_gpu_assigner(tmp_path, monkeypatch):
    """--ondisk on the GPU path: the centroids go to the GPUs once for every block (not once a block), and the
    lists hold what the CPU path's hold."""
    from foco.search import vectors as V
    (tmp_path / "cpu").mkdir()
    (tmp_path / "gpu").mkdir()
    store, x = _store(tmp_path)
    monkeypatch.setattr(V, "ADD_CHUNK", 300)  # several blocks
    V.build_faiss(store, tmp_path / "cpu", V.VectorConfig("IVF16,Flat", train_size=1000, ondisk=True))
    moved = []
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index, co=None, ngpu=-1: moved.append(index) or index)
    rec = V.build_faiss(store, tmp_path / "gpu", V.VectorConfig("IVF16,Flat", train_size=1000, ondisk=True, gpu=True))
    assert rec["gpu"] is True and len(x) > 2 * 300 and len(moved) == 2  # k-means, then one assigner
    a, b = (V.load_vector_index(tmp_path / d / "vectors.faiss", ivf=True, ondisk=True) for d in ("cpu", "gpu"))
    for index in (a, b):
        V.set_search_params(index, nprobe=16)
    assert (V.search_vectors(a, x[:50], 10)[1] == V.search_vectors(b, x[:50], 10)[1]).mean() > 0.95
    store.close()
