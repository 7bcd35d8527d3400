"""`foco serve`: the API answers composed queries with FoCo's attention heatmap, speaks clip-retrieval's
knn-service, counts requests, and meets every bad input with a 4xx JSON error while it keeps serving."""
from __future__ import annotations

import base64
import io

import pytest
import torch
from PIL import Image

pytest.importorskip("faiss")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from foco.model import ComposedQueryEncoder, FoCoConfig  # noqa: E402
from foco.search.build import IndexConfig, build_index  # noqa: E402
from foco.search.engine import SearchEngine  # noqa: E402
from foco.serve.app import ServeLimits, create_app  # noqa: E402


@pytest.fixture(scope="module")
def served(tiny_world, tmp_path_factory):
    """An index of the tiny world's test gallery and an (untrained) FoCo checkpoint for it."""
    base = tmp_path_factory.mktemp("serve")
    build_index(IndexConfig(images=str(tiny_world / "images" / "test-single"), backbone="world:pretrained"),
                base / "index")
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256, learn_bias=True)).save(base / "foco", {"backbone": "world:pretrained"})
    return base


@pytest.fixture(scope="module")
def client(served):
    engine = SearchEngine.open(served / "index", checkpoint=served / "foco")
    return TestClient(create_app(engine, ServeLimits(max_upload_bytes=2 * 1024 * 1024)))


def _big_png(w: int, h: int) -> bytes:
    """A w x h RGB PNG whose pixel data holds only its first rows: a server must refuse it by its header (an
    encoded 20000 x 20000 image takes seconds to write; its decoder would also stop at the cut, with another
    error than the 413 asked for)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    rows = zlib.compress(b"\0" * (1 + 3 * w) * 4)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def _png(w: int, h: int, colour="red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(buf, "PNG")
    return buf.getvalue()


def test_a_composed_search_returns_k_results_and_a_heatmap(client):
    r = client.post("/search", data={"reference_id": "3", "text": "make the circle red", "k": "5",
                                     "method": "foco"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == 5 and all(h["id"] != 3 for h in body["results"])
    scores = [h["score"] for h in body["results"]]
    assert scores == sorted(scores, reverse=True)
    heat = client.get(body["attention_url"])
    assert heat.status_code == 200 and heat.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(heat.content)).size == (256, 256)
    boxed = client.post("/search", data={"reference_id": "3", "text": "make the circle red", "k": "5",
                                         "method": "foco", "box": "0,0,24,24"}).json()
    assert [h["id"] for h in boxed["results"]] != [h["id"] for h in body["results"]] or \
        [h["score"] for h in boxed["results"]] != scores  # the box changes FoCo's query
    up = client.post("/search", data={"text": "a blue star", "k": "3", "method": "slerp"},
                     files={"image": ("r.png", _png(64, 64), "image/png")})
    assert up.status_code == 200 and len(up.json()["results"]) == 3 and up.json()["attention_url"] is None


def test_images_and_thumbnails_by_id_only(client):
    assert client.get("/images/3").headers["content-type"] == "image/png"
    assert client.get("/thumbnails/3").status_code == 200
    for bad in ["/images/../../etc/passwd", "/images/..%2F..%2Fetc%2Fpasswd", "/images/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
                "/images/%252e%252e%252fetc%252fpasswd", "/thumbnails/..%2Fx", "/images/-1", "/images/1e3",
                "/images/999999", "/static/..%2F..%2Fapp.py"]:
        r = client.get(bad)
        assert r.status_code == 404, (bad, r.status_code)
        assert "root:" not in r.text and r.headers["content-type"].startswith("application/json")


BAD_SEARCHES = {
    "non-image upload": ({"text": "x"}, ("a.txt", b"hello world", "text/plain"), 400),
    "truncated JPEG": ({"text": "x"}, ("t.jpg", None, "image/jpeg"), 400),
    "20000 x 20000 PNG": ({"text": "x"}, ("big.png", "BIG", "image/png"), 413),
    "empty text": ({"reference_id": "3", "text": ""}, None, 400),
    "100 kB of text": ({"reference_id": "3", "text": "a" * 100_000}, None, 400),
    "unknown id": ({"reference_id": "987654", "text": "x"}, None, 404),
    "box outside the image": ({"reference_id": "3", "text": "x", "box": "10,10,500,500", "method": "foco"}, None, 400),
    "box that is no box": ({"reference_id": "3", "text": "x", "box": "1,2,3"}, None, 400),
    "k = 0": ({"reference_id": "3", "text": "x", "k": "0"}, None, 400),
    "k = 10^6": ({"reference_id": "3", "text": "x", "k": "1000000"}, None, 400),
    "k not a number": ({"reference_id": "3", "text": "x", "k": "ten"}, None, 400),
    "unknown method": ({"reference_id": "3", "text": "x", "method": "nope"}, None, 400),
    "no reference": ({"text": "x"}, None, 400),
    "oversized upload": ({"text": "x"}, ("huge.png", "HUGE", "image/png"), 413),
}


@pytest.mark.parametrize("case", list(BAD_SEARCHES))
def test_bad_input_gets_a_4xx_and_the_server_keeps_serving(client, case):
    data, upload, status = BAD_SEARCHES[case]
    files = None
    if upload is not None:
        name, content, mime = upload
        if content is None:  # a JPEG cut in half
            buf = io.BytesIO()
            Image.new("RGB", (300, 300), "green").save(buf, "JPEG")
            content = buf.getvalue()[:400]
        elif content == "BIG":
            content = _big_png(20000, 20000)
        elif content == "HUGE":
            content = b"\x89PNG" + b"\0" * (3 * 1024 * 1024)
        files = {"image": (name, content, mime)}
    r = client.post("/search", data=data, files=files)
    assert r.status_code == status, (case, r.status_code, r.text)
    assert r.json()["error"]
    assert client.get("/healthz").status_code == 200
    assert client.post("/search", data={"reference_id": "3", "text": "x", "k": "2", "method": "sum"}).status_code == 200


def test_knn_service_speaks_clip_retrievals_api(client):
    hits = client.post("/knn-service", json={"text": "a red circle", "modality": "image", "num_images": 4,
                                             "indice_name": "index"}).json()
    assert len(hits) == 4 and set(hits[0]) >= {"id", "similarity", "url"}
    emb = client.post("/knn-service", json={"embedding_input": [0.1] * 256, "num_images": 3}).json()
    assert len(emb) == 3
    image = base64.b64encode(_png(64, 64, "blue")).decode()
    assert len(client.post("/knn-service", json={"image": image, "num_images": 2}).json()) == 2
    composed = client.post("/knn-service", json={"image": image, "text": "add a star", "num_images": 2}).json()
    assert len(composed) == 2
    assert client.post("/knn-service", json={"embedding_input": [0.1] * 7}).status_code == 400
    assert client.post("/knn-service", json={"image_url": "http://example.com/x.jpg"}).status_code == 400
    assert client.post("/knn-service", json={"text": "x", "modality": "text"}).status_code == 400
    assert client.get("/indices-list").json() == ["index"]  # one engine: named after its folder, as --index FOLDER


def test_metrics_count_requests_by_status(client):
    client.post("/search", data={"reference_id": "3", "text": ""})
    text = client.get("/metrics").text
    assert 'foco_requests_total{endpoint="/search",status="400"}' in text
    assert "foco_request_seconds_count" in text and "foco_indexed_images" in text


def test_serve_binds_loopback_unless_told(served, capsys):
    from foco.cli import main
    assert main(["serve", "--index", str(served / "index"), "--host", "0.0.0.0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err


def test_the_page_and_its_assets_are_local(client):
    page = client.get("/").text
    assert "<canvas" in page and 'name="viewport"' in page
    for asset in ("/static/app.js", "/static/style.css"):
        assert client.get(asset).status_code == 200
    assert "http://" not in page and "https://" not in page  # no CDN
