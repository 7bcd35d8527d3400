"""clip-retrieval's back-end API, so that its ClipClient (and tools built on it) can use a local `foco serve`.
The specification is clip-retrieval's README and `clip_back.py`:

    POST /knn-service   {text | image (base64) | embedding_input, modality, num_images, num_result_ids,
                        indice_name, deduplicate} -> [{id, similarity, url, caption}, ...]
    POST /metadata      {ids, indice_name} -> [{id, metadata: {url, caption}}, ...]
    GET  /indices-list  ["foco"]

As there: `num_result_ids` (default num_images) neighbours are searched; with `deduplicate`, a result whose
stored vector has cosine >= 0.94 with a better-ranked kept result is dropped (clip-retrieval's connected
components over that threshold); the first `num_images` results carry url and caption, the rest id and
similarity only. Both counts are capped by `--max-knn`. A text with an image is a composed query (foco's own
addition); `image_url` is refused (this server reaches no network); `modality` must be "image"; the safety,
violence and aesthetic options have no model here and are refused when asked for.
"""
from __future__ import annotations

import base64
import binascii

import numpy as np
from fastapi import FastAPI, Request

from ..search.engine import Hit, NotFound, Query, QueryError
from .common import ServeState, TooLarge, decode_upload, too_large_in
from .models import KnnRequest, MetadataRequest, parse

INDEX_NAME = "foco"
DEDUP_COSINE = 0.94  # clip-retrieval's threshold


def dedup(hits: list[Hit], vectors: np.ndarray, threshold: float = DEDUP_COSINE) -> list[Hit]:
    """`hits` in rank order without near-duplicates: a hit joins the component of any hit within `threshold`
    cosine, and each component keeps its best-ranked member."""
    n = len(hits)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    sim = vectors @ vectors.T  # (n, n)
    for i, j in zip(*np.nonzero(np.triu(sim >= threshold, 1))):
        a, b = root(int(i)), root(int(j))
        if a != b:
            parent[max(a, b)] = min(a, b)  # the better rank is the root
    return [h for i, h in enumerate(hits) if root(i) == i]


def register(app: FastAPI, st: ServeState) -> None:
    engine, limits = st.engine, st.limits

    @app.get("/indices-list")
    async def indices_list():
        return [INDEX_NAME]

    @app.post("/metadata")
    async def metadata(request: Request):
        body = parse(MetadataRequest, await _json(request))
        ids = body.ids
        _check_index(body.indice_name)
        if len(ids) > limits.max_knn:
            raise QueryError(f"at most {limits.max_knn} ids per request, got {len(ids)}")
        base = str(request.base_url).rstrip("/")
        rows = await st.on_cpu(engine.store.rows_by_id, ids)
        missing = next((i for i in ids if i not in rows), None)
        if missing is not None:
            raise NotFound(f"no image with id {missing} in this index")
        return [{"id": i, "metadata": {"url": f"{base}/images/{i}", "caption": rows[i].path}} for i in ids]

    @app.post("/knn-service")
    async def knn_service(request: Request):
        body = parse(KnnRequest, await _json(request))
        num_images = body.num_images
        num_ids = body.num_result_ids if body.num_result_ids is not None else num_images
        if not 1 <= num_images <= limits.max_knn or not num_images <= num_ids <= limits.max_knn:
            raise QueryError(f"num_images must be between 1 and {limits.max_knn}, and num_result_ids between "
                             f"num_images and {limits.max_knn} (--max-knn)")
        if body.modality != "image":
            raise QueryError("this index holds images only: modality must be 'image'")
        _check_index(body.indice_name)
        for option in ("use_safety_model", "use_violence_detector"):
            if getattr(body, option):
                raise QueryError(f"{option} has no model in foco serve; leave it false")
        if body.aesthetic_score not in (None, ""):
            raise QueryError("aesthetic_score has no embeddings in foco serve; leave it out")
        if body.image_url:
            raise QueryError("image_url is not fetched by this server (it reaches no network); send the image "
                             "base64-encoded in 'image'")
        text, image_b64, emb = body.text, body.image, body.embedding_input
        if text is not None and len(text) > limits.max_text_chars:
            raise QueryError(f"text must be a string of at most {limits.max_text_chars} characters")
        if emb is not None:
            vec = np.asarray(emb, dtype=np.float64)  # (D,): finite numbers (KnnRequest)
            if vec.shape != (engine.dim,):
                raise QueryError(f"embedding_input has {len(emb)} values; this index holds {engine.dim}-dimensional "
                                 "vectors")
            with np.errstate(over="ignore", under="ignore"):
                v32 = vec.astype(np.float32)  # what the index searches with
                norm = float(np.linalg.norm(v32.astype(np.float64)))
            if not np.all(np.isfinite(v32)):
                raise QueryError("embedding_input holds values beyond float32 (|x| > 3.4e38)")
            if not norm > 0 or not np.isfinite(norm):
                raise QueryError("embedding_input is all zeros (in float32): it has no direction to search along")
            vec = v32.astype(np.float64) / norm
            hits = await st.on_cpu(engine.search_vector, vec, num_ids, limits.max_knn)
        elif image_b64:
            try:
                data = base64.b64decode(image_b64, validate=False)
            except (ValueError, TypeError, binascii.Error):
                raise QueryError("image must be base64") from None
            image = await st.on_cpu(decode_upload, data, limits)
            if text:  # a composed query: what clip-retrieval cannot do
                if num_ids > limits.max_k:
                    raise QueryError(f"a composed query returns at most {limits.max_k} results (--max-k)")
                hits = (await st.batcher.submit(Query(text=text, reference=image, method=st.default_method(),
                                                      k=num_ids))).hits
            else:
                vec = (await st.on_cpu(engine._encode_image, image)).global_[0].numpy()
                hits = await st.on_cpu(engine.search_vector, vec, num_ids, limits.max_knn)
        elif text:
            vec = (await st.on_cpu(engine.encode_text, text)).global_[0].numpy()
            hits = await st.on_cpu(engine.search_vector, vec, num_ids, limits.max_knn)
        else:
            raise QueryError("give one of text, image (base64) or embedding_input")
        if body.deduplicate and len(hits) > 1:
            hits = await st.on_cpu(lambda: dedup(hits, engine.store.vector_rows([h.id for h in hits])))
        base = str(request.base_url).rstrip("/")
        return [({"id": h.id, "similarity": round(h.score, 6), "url": f"{base}/images/{h.id}", "caption": h.path}
                 if r < num_images else {"id": h.id, "similarity": round(h.score, 6)}) for r, h in enumerate(hits)]


async def _json(request: Request) -> dict:
    try:
        body = await request.json()  # BodyLimit caps its size
    except Exception as exc:
        if (big := too_large_in(exc)) is not None:
            raise TooLarge(str(big)) from None
        raise QueryError("the body must be JSON (clip-retrieval's request)") from None
    if not isinstance(body, dict):
        raise QueryError("the body must be a JSON object")
    return body


def _check_index(name: str | None) -> None:
    if name not in (None, "", INDEX_NAME):
        raise NotFound(f"no index named {name!r} here; /indices-list gives [{INDEX_NAME!r}]")
