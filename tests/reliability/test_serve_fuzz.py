"""Issue 24, class 7: the server under a few thousand randomised requests (random paths, methods, fields, types and
sizes; hypothesis, derandomised so that every run sends the same requests). No answer may be a 500, every error is
JSON, and afterwards /healthz and a known good query answer exactly as before."""
from __future__ import annotations

import base64
import io
import json
import math
from urllib.parse import quote

import pytest
import torch

pytest.importorskip("faiss")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from PIL import Image  # noqa: E402

from foco.model import ComposedQueryEncoder, FoCoConfig  # noqa: E402
from foco.search.build import IndexConfig, build_index  # noqa: E402
from foco.search.engine import SearchEngine  # noqa: E402
from foco.serve.app import ServeLimits, create_app  # noqa: E402

PATHS, BODIES, FORMS = 900, 650, 450  # requests of the three tests below: 2,000 in all (plus 1 in 8 forms' knn)


@pytest.fixture(scope="module")
def client(tiny_world, tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    build_index(IndexConfig(images=str(tiny_world / "images" / "test-single"), backbone="world:pretrained"),
                base / "index")
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256, learn_bias=True)).save(base / "foco", {"backbone": "world:pretrained"})
    engine = SearchEngine.open(base / "index", checkpoint=base / "foco")
    return TestClient(create_app(engine, ServeLimits(max_upload_bytes=256 * 1024, max_k=50, max_knn=100)),
                      raise_server_exceptions=False)


def _png(side: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


GOOD = {"reference_id": "3", "text": "make the circle blue", "method": "sum", "k": "5"}

# values of every JSON type and a few that break naive parsers
numbers = st.one_of(st.integers(min_value=-(10 ** 30), max_value=10 ** 30), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 2 ** 63, 2 ** 63 - 1, 2.7, 1e309, -0.0, 40.0]))
texts = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\x00", "５", "²", "٣", "9" * 30, "1e3", "-1",
                                                          "0x10", "make it red", "a" * 2000, "nan", "inf"]))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                             st.dictionaries(texts, inner, max_size=4)), max_leaves=12)
SEGMENTS = st.one_of(texts.map(lambda t: t.replace("/", "").replace("?", "").replace("#", "") or "x"),
                     st.integers(-5, 10 ** 20).map(str))


def _ok(r) -> None:
    assert r.status_code < 500, (r.request.method, r.request.url, r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert "error" in r.json(), r.text[:300]


@settings(max_examples=PATHS, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(["/images/", "/thumbnails/", "/attention/", "/static/", "/gallery", "/healthz",
                              "/metrics", "/indices-list", "/", "/nope/", "/search", "/knn-service", "/metadata"]),
       segment=SEGMENTS, method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
       params=st.dictionaries(st.sampled_from(["offset", "limit", "k", "x"]), texts, max_size=3))
@pytest.mark.slow
def test_random_paths_and_query_strings(client, route, segment, method, params):
    path = route + quote(segment, safe="") if route.endswith("/") and route != "/" else route
    _ok(client.request(method, path, params=params))


KNN_KEYS = ["text", "image", "image_url", "embedding_input", "modality", "num_images", "num_result_ids",
            "indice_name", "deduplicate", "use_safety_model", "use_violence_detector", "aesthetic_score", "ids"]


@settings(max_examples=BODIES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(["/knn-service", "/metadata"]),
       body=st.one_of(json_values, st.dictionaries(st.sampled_from(KNN_KEYS), json_values, max_size=6)),
       embedding=st.one_of(st.none(), st.lists(numbers, min_size=0, max_size=300),
                           st.just([0.0] * 256), st.just([0.01] * 256)),
       raw=st.sampled_from([None, b"{", b"[1, 2", b"\xff\xfe", b"NaN", b'{"text": "x"}' * 3]))
@pytest.mark.slow
def test_random_json_bodies(client, route, body, embedding, raw):
    if raw is not None:
        r = client.post(route, content=raw, headers={"content-type": "application/json"})
    else:
        if isinstance(body, dict) and embedding is not None:
            body = {**body, "embedding_input": embedding, "num_images": body.get("num_images", 3)}
        r = client.post(route, content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    _ok(r)


FORM_KEYS = ["text", "reference_id", "k", "method", "box", "chord", "image", "extra"]
IMAGE = base64.b64encode(_png()).decode()


@settings(max_examples=FORMS, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(fields=st.dictionaries(st.sampled_from(FORM_KEYS), texts, max_size=6),
       good=st.sampled_from([False, False, True]), upload=st.sampled_from([None, None, "png", "garbage", "empty"]),
       knn_image=st.sampled_from([False] * 7 + [True]))
@pytest.mark.slow
def test_random_search_forms(client, fields, good, upload, knn_image):
    data = {**(GOOD if good else {}), **fields}
    files = None
    if upload == "png":
        files = {"image": ("r.png", _png(), "image/png")}
    elif upload == "garbage":
        files = {"image": ("r.png", b"\x89PNG not really", "image/png")}
    elif upload == "empty":
        files = {"image": ("r.png", b"", "image/png")}
    _ok(client.post("/search", data=data, files=files))
    if knn_image:
        _ok(client.post("/knn-service", json={"image": IMAGE, "text": fields.get("text"), "num_images": 3}))


def test_after_the_fuzz_the_server_answers_as_before(client):
    """Runs after the three above (file order): the same health and the same answer to a known query as a fresh
    server over the same index."""
    health = client.get("/healthz").json()
    answer = client.post("/search", data=GOOD).json()
    fresh_engine = SearchEngine.open(client.app.state.foco.engine.folder,
                                     checkpoint=client.app.state.foco.engine.options.get("checkpoint"))
    fresh = TestClient(create_app(fresh_engine, ServeLimits(max_upload_bytes=256 * 1024, max_k=50, max_knn=100)))
    want = fresh.post("/search", data=GOOD).json()
    assert [(r["id"], r["score"]) for r in answer["results"]] == [(r["id"], r["score"]) for r in want["results"]]
    assert {k: v for k, v in health.items() if k != "pid"} == \
        {k: v for k, v in fresh.get("/healthz").json().items() if k != "pid"}
    assert health["status"] == "ok" and math.isfinite(answer["results"][0]["score"])
