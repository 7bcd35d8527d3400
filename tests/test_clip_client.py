"""clip-retrieval's own ClipClient, unmodified and with its constructor defaults, against `foco serve` on loopback
(issue 38): text, image and embedding queries, num_images, deduplicate, /metadata, two named indexes, and 64
concurrent queries without an error.

`make test` installs clip-retrieval without its dependencies; its `clip_client.py` needs only `requests` and is
loaded by path, as the package's `__init__` imports the whole back end (Flask, FAISS, torch models).
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, files

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("fastapi")
requests = pytest.importorskip("requests")
pytestmark = pytest.mark.slow  # a real server in a subprocess: make test runs these, make test-fast does not


def _clip_client():
    try:
        found = [f for f in files("clip-retrieval") or [] if str(f).endswith("clip_retrieval/clip_client.py")]
    except PackageNotFoundError:
        found = []
    if not found:
        pytest.skip("clip-retrieval is not installed: `make test` installs it (pip install --no-deps clip-retrieval)")
    spec = importlib.util.spec_from_file_location("clip_client", found[0].locate())
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def server(tiny_world, four_image_index, tmp_path_factory, free_port):
    """`foco serve --index four=FOUR --index GALLERY`: two named indexes, the second named by its folder."""
    from foco.search.build import IndexConfig, build_index
    base = tmp_path_factory.mktemp("clip-client")
    (base / "imgs").mkdir()
    for p in sorted((tiny_world / "images" / "test-single").glob("*.png"))[:24]:
        shutil.copy(p, base / "imgs" / p.name)
    shutil.copy(p, base / "imgs" / "copy-of-the-last.png")  # a duplicate for deduplicate to drop
    build_index(IndexConfig(images=str(base / "imgs"), backbone="world:pretrained"), base / "gallery")
    shutil.copy(four_image_index / "index.json", base / "four.json")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "foco", "serve", "--index", f"four={four_image_index}",
                             "--index", str(base / "gallery"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=open(base / "serve.log", "w"), text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            if requests.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise RuntimeError("foco serve exited:\n" + (base / "serve.log").read_text()[-3000:])
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("foco serve did not answer /healthz within 120 s")
        time.sleep(0.3)
    yield url, base
    proc.terminate()
    proc.wait(timeout=30)


def test_the_real_client_with_its_defaults_answers_text_image_and_embedding_queries(server):
    url, base = server
    ClipClient = _clip_client().ClipClient
    client = ClipClient(url + "/knn-service", indice_name="gallery", num_images=5)  # every other option: default
    assert client.use_safety_model and client.use_violence_detector and client.aesthetic_score == 9
    by_text = client.query(text="a red circle")
    assert isinstance(by_text, list) and 1 <= len(by_text) <= 5, by_text  # deduplicate (a default) may drop some
    assert all({"id", "similarity", "url", "caption"} <= set(r) for r in by_text)
    assert [r["similarity"] for r in by_text] == sorted((r["similarity"] for r in by_text), reverse=True)
    image = sorted((base / "imgs").glob("*.png"))[3]
    by_image = client.query(image=str(image))
    assert 1 <= len(by_image) <= 5 and by_image[0]["caption"] == image.name  # an indexed image finds itself first
    assert by_image[0]["similarity"] > 0.999
    vec = _vector_of(base / "gallery", by_image[0]["id"])
    by_embedding = client.query(embedding_input=vec.tolist())
    assert [r["id"] for r in by_embedding] == [r["id"] for r in by_image]
    got = requests.get(by_text[0]["url"], timeout=10)
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    assert got.content == (base / "imgs" / by_text[0]["caption"]).read_bytes()


def four_images(base):
    """The folder the four-image index was built from (its index.json records it)."""
    import json
    from pathlib import Path
    return Path(json.loads((base / "four.json").read_text())["images"])


def _vector_of(index_folder, image_id: int) -> np.ndarray:
    """The stored (D,) vector of one indexed image."""
    from foco.search.store import ImageStore
    return ImageStore(index_folder / "images.sqlite", readonly=True).vector_rows([image_id])[0]


def test_what_the_defaults_ask_for_is_skipped_and_said(server):
    url, _ = server
    body = {"text": "a blue square", "modality": "image", "num_images": 3, "indice_name": "gallery",
            "use_safety_model": True, "use_violence_detector": True, "aesthetic_score": 9, "aesthetic_weight": 0.5,
            "deduplicate": True, "use_mclip": False}
    r = requests.post(url + "/knn-service", json=body, timeout=30)
    assert r.status_code == 200 and len(r.json()) == 3
    assert r.headers["X-Foco-Skipped"] == "use_safety_model,use_violence_detector,aesthetic_score"
    plain = requests.post(url + "/knn-service", json={**body, "use_safety_model": False, "use_violence_detector": False,
                                                       "aesthetic_score": ""}, timeout=30)
    assert "X-Foco-Skipped" not in plain.headers and plain.json() == r.json()  # skipped means: no effect
    for bad in ({"aesthetic_score": "nine"}, {"aesthetic_score": 10}, {"aesthetic_weight": 1.5},
                {"aesthetic_weight": "heavy"}, {"use_safety_model": "yes"}, {"aesthetic_score": 2.5}):
        r = requests.post(url + "/knn-service", json={**body, **bad}, timeout=30)
        assert r.status_code == 400 and next(iter(bad)) in r.json()["error"], (bad, r.text)


def test_num_images_and_deduplicate_as_the_client_sends_them(server):
    url, base = server
    ClipClient = _clip_client().ClipClient
    many = ClipClient(url + "/knn-service", indice_name="gallery", num_images=20, deduplicate=False)
    kept = ClipClient(url + "/knn-service", indice_name="gallery", num_images=20)  # deduplicate: the default, True
    duplicate = str(base / "imgs" / "copy-of-the-last.png")
    a, b = many.query(image=duplicate), kept.query(image=duplicate)
    assert len(a) == 20 and a[0]["similarity"] > 0.999 and a[1]["similarity"] > 0.999  # the file and its copy
    assert {a[0]["caption"], a[1]["caption"]} == {"copy-of-the-last.png", sorted(p.name for p in (
        base / "imgs").glob("*.png") if p.name != "copy-of-the-last.png")[-1]}
    ids_a = [r["id"] for r in a]
    assert [r["id"] for r in b] == [i for i in ids_a if i in {r["id"] for r in b}]  # a subsequence, in rank order
    assert b[0]["id"] == a[0]["id"] and a[1]["id"] not in {r["id"] for r in b}  # the copy is dropped
    assert len(ClipClient(url + "/knn-service", indice_name="gallery", num_images=7,
                          deduplicate=False).query(text="a red circle")) == 7


def test_metadata_and_two_named_indexes(server):
    url, base = server
    assert requests.get(url + "/indices-list", timeout=10).json() == ["four", "gallery"]
    ClipClient = _clip_client().ClipClient
    four = ClipClient(url + "/knn-service", indice_name="four", num_images=10,
                      deduplicate=False).query(text="a red circle")
    gallery = ClipClient(url + "/knn-service", indice_name="gallery", num_images=10,
                         deduplicate=False).query(text="a red circle")
    assert len(four) == 4 and len(gallery) == 10  # each index answers from its own images
    meta = requests.post(url + "/metadata", json={"indice_name": "gallery", "ids": [r["id"] for r in gallery[:3]]},
                         timeout=10).json()
    assert [m["id"] for m in meta] == [r["id"] for r in gallery[:3]]
    assert [m["metadata"]["caption"] for m in meta] == [r["caption"] for r in gallery[:3]]
    assert all((base / "imgs" / m["metadata"]["caption"]).is_file() for m in meta)
    for r in four:  # the first index is the default: its urls need no name, and serve its own files
        assert "indice_name" not in r["url"]
        assert requests.get(r["url"], timeout=10).content == (four_images(base) / r["caption"]).read_bytes()
    for r in gallery:  # another index's urls name it (ids 1-4 exist in both)
        assert r["url"].endswith("?indice_name=gallery")
        assert requests.get(r["url"], timeout=10).content == (base / "imgs" / r["caption"]).read_bytes()
    unknown = requests.post(url + "/knn-service", json={"text": "x", "indice_name": "laion5B", "num_images": 2},
                            timeout=10)
    assert unknown.status_code == 404 and "four" in unknown.json()["error"] and "gallery" in unknown.json()["error"]


def test_64_concurrent_queries_from_the_real_client_without_an_error(server):
    url, _ = server
    client = _clip_client().ClipClient(url + "/knn-service", indice_name="gallery", num_images=5, deduplicate=False)
    texts = [f"a {c} {s}" for c in ("red", "blue", "green", "yellow", "purple", "orange", "white", "black")
             for s in ("circle", "square", "star", "heart", "triangle", "cross", "crescent", "hexagon")]
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda t: client.query(text=t), texts))
    assert len(answers) == 64
    assert all(isinstance(a, list) and len(a) == 5 for a in answers), [a for a in answers if not isinstance(a, list)]
    alone = client.query(text=texts[17])
    assert [r["id"] for r in alone] == [r["id"] for r in answers[17]]
