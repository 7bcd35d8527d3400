"""Issue 38 in the server itself: /knn-service through the micro-batcher with each query's answer what it gets
alone, clip_back's optional fields skipped and said, named indexes, and the server faults fixed at their roots (one
text rule, bounded numbers, counts and rows from one generation after an update, a changed file never served from
its old vector)."""
from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("faiss")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from foco.search.build import IndexConfig, build_index, update_index  # noqa: E402
from foco.search.engine import Query, QueryError, SearchEngine, VectorQuery  # noqa: E402
from foco.serve.app import ServeLimits, create_app  # noqa: E402


@pytest.fixture(scope="module")
def engine(four_image_index):
    return SearchEngine.open(four_image_index)


def test_vector_queries_batched_answer_what_each_gets_alone(engine, tiny_world):
    images = sorted((tiny_world / "images" / "test-single").glob("*.png"))
    vec = engine.store.vector_rows([1])[0]
    qs = [VectorQuery(text="a red circle", k=3), VectorQuery(text="a big blue square on a beach", k=4),
          VectorQuery(image=Image.open(images[5]).convert("RGB"), k=2), VectorQuery(vector=vec, k=4),
          VectorQuery(text="   ", k=3), VectorQuery(vector=vec[:7], k=2), VectorQuery(text="a star", k=0),
          VectorQuery(text="a green heart", k=1)]
    together = engine.search_many(qs)
    for q, got in zip(qs, together):
        alone = engine.search_many([q])[0]
        if isinstance(alone, QueryError):
            assert isinstance(got, QueryError) and str(got) == str(alone)
            continue
        assert [h.id for h in got.hits] == [h.id for h in alone.hits], q
        assert np.allclose([h.score for h in got.hits], [h.score for h in alone.hits], atol=1e-5)
    assert sum(isinstance(a, QueryError) for a in together) == 3
    assert together[3].hits[0].id == 1 and together[3].hits[0].score == pytest.approx(1.0, abs=1e-5)


def test_knn_service_goes_through_the_batcher_and_each_answer_is_its_own(engine):
    app = create_app({"four": engine}, ServeLimits(max_batch=32, max_wait_ms=50), watch=False)
    texts = [f"a {c} {s}" for c in ("red", "blue", "green", "white") for s in ("circle", "star", "cross", "heart")]
    st = app.state.foco

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://foco") as c:
            together = await asyncio.gather(*[c.post("/knn-service", json={"text": t, "num_images": 3})
                                              for t in texts])
            before = st.default.batcher.batches
            alone = [await c.post("/knn-service", json={"text": t, "num_images": 3}) for t in texts]
            return together, alone, before
    together, alone, batches = asyncio.run(run())
    assert all(r.status_code == 200 for r in together + alone)
    assert 0 < batches < len(texts)  # 16 concurrent queries ran through the batcher, in fewer batches than queries
    assert st.default.batcher.queries == 2 * len(texts)  # and so did the 16 sent one at a time
    for a, b in zip(together, alone):
        assert [h["id"] for h in a.json()] == [h["id"] for h in b.json()]
        assert np.allclose([h["similarity"] for h in a.json()], [h["similarity"] for h in b.json()], atol=1e-5)


def test_optional_fields_are_skipped_and_said_and_malformed_ones_refused(engine):
    c = TestClient(create_app({"four": engine}, watch=False))
    body = {"text": "a red circle", "num_images": 2, "use_safety_model": True, "use_violence_detector": True,
            "aesthetic_score": "9", "aesthetic_weight": "0.5", "use_mclip": True}
    r = c.post("/knn-service", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["x-foco-skipped"] == "use_safety_model,use_violence_detector,use_mclip,aesthetic_score"
    plain = c.post("/knn-service", json={"text": "a red circle", "num_images": 2})
    assert "x-foco-skipped" not in plain.headers and plain.json() == r.json()
    for bad in ({"use_safety_model": "true"}, {"use_violence_detector": 1}, {"aesthetic_score": -1},
                {"aesthetic_score": "9.5"}, {"aesthetic_score": [9]}, {"aesthetic_weight": -0.1},
                {"aesthetic_weight": "1e308"}, {"aesthetic_weight": True}, {"use_mclip": None}):
        r = c.post("/knn-service", json={**body, **bad})
        assert r.status_code == 400 and next(iter(bad)) in r.json()["error"], (bad, r.text)


def test_one_text_rule_on_every_route(engine):
    c = TestClient(create_app({"four": engine}, watch=False))
    for text in ("   ", "\u200b\u200b", "\ufeff \u2060"):
        knn = c.post("/knn-service", json={"text": text, "num_images": 2})
        search = c.post("/search", data={"reference_id": "1", "text": text, "method": "sum"})
        assert knn.status_code == search.status_code == 400, (text, knn.text, search.text)
        assert knn.json()["error"] == search.json()["error"]
    lone = c.post("/knn-service", content=b'{"text": "a red \\ud800 circle", "num_images": 2}',
                  headers={"content-type": "application/json"})
    assert lone.status_code == 400 and "surrogate" in lone.json()["error"], lone.text
    same = "holds a lone surrogate U+D800 at character 7"  # the one rule's words, in the request model and the engine
    assert same in lone.json()["error"] and same in str(engine.search_many([Query("a red \ud800 circle", 1, "sum")])[0])
    assert c.get("/healthz").status_code == 200


def test_numbers_are_bounded_and_no_answer_holds_an_infinity(engine):
    c = TestClient(create_app({"four": engine}, watch=False))
    for chord in ("1e308", "101", "-1", "nan", "inf"):
        r = c.post("/search", data={"reference_id": "1", "text": "x", "method": "sum", "chord": chord})
        assert r.status_code == 400 and "chord" in r.json()["error"], (chord, r.text)
    ok = c.post("/search", data={"reference_id": "1", "text": "x", "method": "sum", "chord": "100", "k": "3"})
    assert ok.status_code == 200 and all(np.isfinite(h["score"]) for h in ok.json()["results"])
    big = c.post("/knn-service", json={"embedding_input": [1e30] * engine.dim, "num_images": 3})
    assert big.status_code == 200 and all(abs(h["similarity"]) <= 1.0001 for h in big.json())


def _copy_index(folder, tiny_world, tmp_path, n: int):
    """An index of n of the tiny world's images in a folder of its own (so the test may change the files)."""
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    src = sorted((tiny_world / "images" / "test-single").glob("*.png"))
    for p in src[:n]:
        shutil.copy(p, imgs / p.name)
    build_index(IndexConfig(images=str(imgs), backbone="world:pretrained"), tmp_path / "idx")
    return imgs, src


def test_after_an_update_counts_rows_and_results_come_from_one_generation(tiny_world, tmp_path):
    imgs, src = _copy_index(None, tiny_world, tmp_path, 6)
    engine = SearchEngine.open(tmp_path / "idx")
    c = TestClient(create_app({"idx": engine}, watch=False))
    assert c.get("/gallery").json()["total"] == c.get("/healthz").json()["images"] == 6
    for p in src[6:10]:
        shutil.copy(p, imgs / p.name)
    (imgs / src[0].name).unlink()
    update_index(tmp_path / "idx")
    assert engine.refresh() and not engine.refresh()  # loaded once; nothing new the second time
    gallery = c.get("/gallery", params={"limit": 100}).json()
    assert gallery["total"] == len(gallery["items"]) == c.get("/healthz").json()["images"] == 9
    assert {i["path"] for i in gallery["items"]} == {p.name for p in src[1:10]}
    new_id = max(i["id"] for i in gallery["items"])
    found = c.post("/knn-service", json={"embedding_input": engine.store.vector_rows([new_id])[0].tolist(),
                                         "num_images": 1}).json()
    assert found[0]["id"] == new_id  # the new image is searchable, not only listed


def test_a_changed_file_is_never_served_from_its_old_vector_whatever_the_method(tiny_world, tmp_path):
    imgs, _ = _copy_index(None, tiny_world, tmp_path, 6)
    engine = SearchEngine.open(tmp_path / "idx")
    c = TestClient(create_app({"idx": engine}, watch=False))
    row = engine.row(2)
    assert c.post("/search", data={"reference_id": "2", "text": "x", "method": "sum"}).status_code == 200
    (imgs / row.path).write_bytes(b"garbage, not a PNG")
    for method in engine.available_methods():
        r = c.post("/search", data={"reference_id": "2", "text": "make it red", "method": method})
        assert r.status_code == 404 and "foco index update" in r.json()["error"], (method, r.text)
    other = sorted(p for p in imgs.iterdir() if p.name != row.path)[0]
    shutil.copy(other, imgs / row.path)  # a valid image again, but other bytes than were indexed
    r = c.post("/search", data={"reference_id": "2", "text": "x", "method": "sum"})
    assert r.status_code == 404, r.text
    assert c.get("/images/2").status_code == c.get("/thumbnails/2").status_code == 404  # its id named other bytes
    update_index(tmp_path / "idx")
    assert engine.refresh()
    new = [i for i in c.get("/gallery").json()["items"] if i["path"] == row.path][0]
    assert new["id"] != 2 and c.get(f"/images/{new['id']}").content == (imgs / row.path).read_bytes()
    assert engine.store.count() == engine.store.db.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 6

def test_named_indexes_on_every_route(engine, tiny_world, tmp_path):
    _copy_index(None, tiny_world, tmp_path, 6)
    other = SearchEngine.open(tmp_path / "idx")
    c = TestClient(create_app({"four": engine, "six": other}, watch=False))
    assert c.get("/indices-list").json() == ["four", "six"]
    assert c.get("/gallery").json()["total"] == 4
    six = c.get("/gallery", params={"indice_name": "six"}).json()
    assert six["total"] == 6 and all(i["thumbnail_url"].endswith("?indice_name=six") for i in six["items"])
    for i in (1, 5):  # the name picks the file
        assert c.get(f"/images/{i}", params={"indice_name": "six"}).content == other.file(i).read_bytes()
    assert c.get("/images/1").content == engine.file(1).read_bytes() != other.file(1).read_bytes()  # id 1: in both
    assert c.get("/images/5").status_code == 404  # the default index has 4
    r = c.post("/search", data={"reference_id": "5", "text": "x", "method": "sum", "indice_name": "six", "k": "3"})
    assert r.status_code == 200 and r.json()["index"] == "six"
    assert all(h["image_url"].endswith("?indice_name=six") for h in r.json()["results"])
    assert c.post("/search", data={"reference_id": "5", "text": "x", "method": "sum"}).status_code == 404  # four has 4
    meta = c.post("/metadata", json={"indice_name": "six", "ids": [5, 6]}).json()
    assert [m["id"] for m in meta] == [5, 6] and meta[0]["metadata"]["url"].endswith("/images/5?indice_name=six")
    health = c.get("/healthz").json()
    assert health["index"] == "four" and health["indexes"]["six"]["images"] == 6
    for route, kwargs in (("/knn-service", {"json": {"text": "x", "indice_name": "nope"}}),
                          ("/metadata", {"json": {"ids": [1], "indice_name": "nope"}})):
        r = c.post(route, **kwargs)
        assert r.status_code == 404 and "four" in r.json()["error"], r.text
    assert c.get("/images/1", params={"indice_name": "nope"}).status_code == 404


def test_index_names_from_the_command_line(tmp_path):
    from foco.search.named import named_indexes
    assert named_indexes(["a=x/one", str(tmp_path / "gallery"), "runs/a=b/c"]) == {
        "a": tmp_path.__class__("x/one"), "gallery": tmp_path / "gallery", "c": tmp_path.__class__("runs/a=b/c")}
    with pytest.raises(ValueError, match="two indexes are named 'x'"):
        named_indexes(["x=one", "x=two"])
    with pytest.raises(ValueError, match="NAME=FOLDER"):
        named_indexes([str(tmp_path / "has space")])
