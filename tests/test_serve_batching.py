"""The server at load: micro-batched composed queries answer exactly what each answers alone, a slow search holds
up neither /healthz nor the image routes, the index is memory-mapped, and clip-retrieval's /metadata,
num_result_ids and deduplicate behave as its back end's."""
from __future__ import annotations

import asyncio
import io
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("faiss")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from foco.model import ComposedQueryEncoder, FoCoConfig  # noqa: E402
from foco.search.build import IndexConfig, build_index  # noqa: E402
from foco.search.engine import Query, QueryError, SearchEngine  # noqa: E402
from foco.serve.app import ServeLimits, create_app  # noqa: E402
from foco.serve.batcher import MicroBatcher  # noqa: E402


@pytest.fixture(scope="module")
def engine(tiny_world, tmp_path_factory):
    base = tmp_path_factory.mktemp("batching")
    build_index(IndexConfig(images=str(tiny_world / "images" / "test-single"), backbone="world:pretrained",
                            with_patches=True), base / "index")
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256, learn_bias=True)).save(base / "foco", {"backbone": "world:pretrained"})
    return SearchEngine.open(base / "index", checkpoint=base / "foco")


def test_a_batch_answers_what_each_query_answers_alone(engine, tiny_world):
    upload = Image.open(sorted((tiny_world / "images" / "test-single").glob("*.png"))[7]).convert("RGB")
    queries = [Query("make the circle red", 3, "foco", k=5), Query("add a star", 4, "foco", k=7, box=(0, 0, 30, 30)),
               Query("a blue square", 5, "sum", k=4), Query("remove the triangle", upload, "foco", k=5),
               Query("make it small", 999999, "foco", k=5),  # an unknown id: its own error, nobody else's
               Query("make it green", 6, "slerp", k=3, chord=0.5), Query("x", 8, "foco", k=5, box=(0, 0, 999, 9)),
               Query("the big circle", 9, "foco", k=6, keep_reference=True), Query("", 3, "sum")]
    together = engine.search_many(queries)
    for q, got in zip(queries, together):
        try:
            alone = engine.search(q)
        except QueryError as exc:
            assert isinstance(got, QueryError) and str(got) == str(exc)
            continue
        assert [h.id for h in got.hits] == [h.id for h in alone.hits], q
        assert np.allclose([h.score for h in got.hits], [h.score for h in alone.hits], atol=1e-5)
        assert (got.attention is None) == (alone.attention is None)
        if got.attention is not None:
            assert torch.allclose(got.attention, alone.attention, atol=1e-5)
    assert sum(isinstance(a, QueryError) for a in together) == 3


def test_the_batcher_groups_what_arrives_together_up_to_its_limit():
    seen = []

    def run(items):
        seen.append(len(items))
        time.sleep(0.05)
        return [i * 10 for i in items]

    async def main():
        b = MicroBatcher(run, max_batch=4, max_wait_ms=20)
        out = await asyncio.gather(*(b.submit(i) for i in range(10)))
        b.close()
        return out

    assert asyncio.run(main()) == [i * 10 for i in range(10)]
    assert max(seen) == 4 and len(seen) <= 4 and sum(seen) == 10

    async def one_at_a_time():
        b = MicroBatcher(run, max_batch=1, max_wait_ms=0)
        await asyncio.gather(*(b.submit(i) for i in range(3)))
        b.close()
    seen.clear()
    asyncio.run(one_at_a_time())
    assert seen == [1, 1, 1]


def test_a_slow_search_delays_neither_healthz_nor_thumbnails(engine, monkeypatch):
    app = create_app(engine, ServeLimits())
    release = threading.Event()
    real = engine.search_many

    def slow(queries):
        release.wait(10)
        return real(queries)

    monkeypatch.setattr(app.state.foco.default.batcher, "run", slow)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://foco") as c:
            searches = [asyncio.create_task(c.post("/search", data={"reference_id": "3", "text": "make it red",
                                                                    "method": "sum", "k": "3"})) for _ in range(8)]
            await asyncio.sleep(0.2)  # the searches are waiting on the stalled batch
            t0 = time.perf_counter()
            health = await c.get("/healthz")
            health_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            thumb = await c.get("/thumbnails/4")
            thumb_s = time.perf_counter() - t0
            pending = sum(not s.done() for s in searches)
            release.set()
            results = await asyncio.gather(*searches)
        return health, health_s, thumb, thumb_s, pending, results

    health, health_s, thumb, thumb_s, pending, results = asyncio.run(main())
    assert health.status_code == 200 and thumb.status_code == 200
    assert pending == 8  # every search was still waiting while both answered
    assert health_s < 0.5 and thumb_s < 2.0, (health_s, thumb_s)
    assert all(r.status_code == 200 and len(r.json()["results"]) == 3 for r in results)


def test_the_index_is_loaded_memory_mapped_and_read_only(engine):
    """The FAISS file is a read-only mapping of this process (/proc/self/maps); the feature arrays are read by row
    (pread) and never mapped or loaded whole."""
    engine.store.vector_rows([3, 4])
    engine.store.patch_rows(3)
    maps = {line.split()[5]: line.split()[1] for line in open("/proc/self/maps") if len(line.split()) >= 6}
    index_file = str((engine.folder / "vectors.faiss").resolve())
    assert index_file in maps and "w" not in maps[index_file]
    for kind in ("vectors", "patches"):
        shard = next(str(p.resolve()) for p in (engine.folder / kind).iterdir())
        assert shard not in maps, kind


def test_metadata_num_result_ids_and_deduplicate_as_clip_retrieval(engine):
    from fastapi.testclient import TestClient
    c = TestClient(create_app(engine, ServeLimits(max_knn=50)))
    meta = c.post("/metadata", json={"ids": [3, 5], "indice_name": "index"}).json()  # the folder's name
    assert [m["id"] for m in meta] == [3, 5] and set(meta[0]["metadata"]) == {"url", "caption"}
    assert meta[0]["metadata"]["url"].endswith("/images/3")
    assert c.post("/metadata", json={"ids": [], "indice_name": "index"}).json() == []
    assert c.post("/metadata", json={"ids": [10 ** 9]}).status_code == 404
    assert c.post("/metadata", json={"ids": ["3"]}).status_code == 400
    assert c.post("/metadata", json={"ids": [3], "indice_name": "laion5B"}).status_code == 404
    emb = engine.store.vector_rows([3])[0].tolist()
    hits = c.post("/knn-service", json={"embedding_input": emb, "num_images": 3, "num_result_ids": 10,
                                        "modality": "image", "indice_name": "index"}).json()
    assert len(hits) == 10 and all("url" in h for h in hits[:3]) and not any("url" in h for h in hits[3:])
    assert hits[0]["id"] == 3
    dup = c.post("/knn-service", json={"embedding_input": emb, "num_images": 10, "num_result_ids": 10,
                                       "deduplicate": True}).json()
    vecs = engine.store.vector_rows([h["id"] for h in dup])
    sim = vecs @ vecs.T
    assert len(dup) <= 10 and (sim[np.triu_indices(len(dup), 1)] < 0.94).all() and dup[0]["id"] == 3
    assert c.post("/knn-service", json={"embedding_input": emb, "num_images": 51}).status_code == 400
    assert c.post("/knn-service", json={"embedding_input": emb, "num_images": 5, "num_result_ids": 4}).status_code == 400


def test_dedup_keeps_the_best_ranked_of_each_near_duplicate_group():
    from foco.search.engine import Hit
    from foco.serve.knn import dedup
    v = np.eye(4, dtype=np.float32)
    v = np.stack([v[0], v[0] * 0.99 + v[1] * 0.01, v[1], v[2], v[1] * 0.98 + v[3] * 0.02])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    hits = [Hit(i, str(i), 1.0 - i / 10) for i in range(5)]
    assert [h.id for h in dedup(hits, v)] == [0, 2, 3]


def test_a_chunked_body_past_the_cap_is_refused_as_it_streams(engine):
    from fastapi.testclient import TestClient
    c = TestClient(create_app(engine, ServeLimits(max_upload_bytes=100_000)))

    def chunks(head=b""):
        yield head
        for _ in range(40):
            yield b"x" * 10_000
    part = b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n'
    r = c.post("/search", content=chunks(part), headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 413 and "capped" in r.json()["error"]
    r = c.post("/knn-service", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert c.post("/search", files={"box": ("b.txt", b"0,0,1,1")},
                  data={"reference_id": "3", "text": "x", "method": "foco"}).status_code == 400
    assert c.get("/healthz").status_code == 200


@pytest.mark.slow
def test_two_workers_share_the_index_and_each_others_heatmaps(engine, tmp_path, free_port):
    """`foco serve --workers 2`: two processes answer over the same index, and a heatmap made by one is found by the
    other (they share a folder)."""
    import os
    import subprocess
    import sys
    port = free_port()
    ckpt = engine.options.get("checkpoint")
    server = subprocess.Popen([sys.executable, "-m", "foco", "serve", "--index", str(engine.folder), "--checkpoint",
                               str(ckpt), "--port", str(port), "--workers", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        pids = set()
        while len(pids) < 2 and time.time() < deadline:
            try:
                with httpx.Client(timeout=5) as c:  # a new connection each time: the kernel spreads them
                    pids.add(c.get(url + "/healthz").json()["pid"])
            except httpx.HTTPError:
                if server.poll() is not None:
                    raise AssertionError(server.stderr.read()[-2000:])
                time.sleep(0.3)
        assert len(pids) == 2
        tokens = []
        for _ in range(6):
            with httpx.Client(timeout=60) as c:
                r = c.post(url + "/search", data={"reference_id": "3", "text": "make it red", "method": "foco"})
                assert r.status_code == 200, r.text
                tokens.append(r.json()["attention_url"])
        for t in tokens:
            with httpx.Client(timeout=60) as c:
                assert c.get(url + t).headers["content-type"] == "image/png"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_ids_and_counts_are_strict_integers(engine):
    from fastapi.testclient import TestClient
    c = TestClient(create_app(engine, ServeLimits()))
    for path in ("/images/%C2%B2", "/images/%EF%BC%95", "/thumbnails/%D9%A3"):  # "²", a full-width 5, an Arabic 3
        r = c.get(path)
        assert r.status_code == 404 and r.json()["error"], path
    assert c.get("/images/5").status_code == 200
    assert c.get("/gallery", params={"offset": str(10 ** 30)}).status_code == 400
    r = c.post("/search", data={"reference_id": "9" * 30, "text": "x", "method": "sum"})
    assert r.status_code == 400 and "int64" in r.json()["error"]
    emb = engine.store.vector_rows([3])[0].tolist()
    for bad in ({"num_images": 2.7}, {"num_images": "1e3"}, {"num_images": True}):
        r = c.post("/knn-service", json={"embedding_input": emb, **bad})
        assert r.status_code == 400 and "integer" in r.json()["error"], bad
    for emb_bad in (["a", "b"], [[0.1], [0.2, 0.3]], [0.0] * engine.dim):
        assert c.post("/knn-service", json={"embedding_input": emb_bad, "num_images": 2}).status_code == 400
    r = c.post("/knn-service", content=b'{"embedding_input": [0.1], "num_images": 1e309}',
               headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert len(c.post("/knn-service", json={"embedding_input": emb, "num_images": 40.0}).json()) == 40
