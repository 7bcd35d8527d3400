"""clip-retrieval's back-end API, so that its ClipClient (and tools built on it) can use a local `foco serve` as
they are, with their defaults. The specification is clip-retrieval's README and `clip_back.py`:

    POST /knn-service   {text | image (base64) | embedding_input, modality, num_images, num_result_ids,
                        indice_name, deduplicate, use_safety_model, use_violence_detector, use_mclip,
                        aesthetic_score, aesthetic_weight} -> [{id, similarity, url, caption}, ...]
    POST /metadata      {ids, indice_name} -> [{id, metadata: {url, caption}}, ...]
    GET  /indices-list  the served indexes' names, in --index order

Every field, and what foco does with it (docs/search.md has the same table):
- `text`, `image`, `embedding_input`: the query, as there ("" is no text). A text with an image is a composed query
  (foco's own addition, through the server's default method). A blank text is refused, as on /search. An
  `embedding_input` with a text or an image is refused: clip_back would search the text and silently drop it.
- `image_url`: refused (this server reaches no network); send the image base64-encoded in `image`.
- `modality`: "image" (the indexes hold images only); "text" is refused.
- `num_images`, `num_result_ids` (default num_images): as there, `num_result_ids` neighbours are searched and the
  first `num_images` carry url and caption; both capped by `--max-knn`.
- `indice_name`: picks one of the served indexes; none or "" is the first, as clip_back takes its first.
- `deduplicate`: as there, a result whose stored vector has cosine >= 0.94 with a better-ranked kept one is dropped.
- `use_safety_model`, `use_violence_detector`, `use_mclip`, `aesthetic_score` (with `aesthetic_weight`): clip_back
  applies them only when it has their models or embeddings loaded, and goes on without them otherwise. foco has
  none, so they are accepted and skipped, and never silently: the answer's `X-Foco-Skipped` header lists each one
  a request asked for. Their values are still checked (booleans; a level 0-9; a weight 0-1).

Text, image and embedding queries go through the index's micro-batcher (`VectorQuery`), as composed ones do: one
text encoding, one image encoding and one FAISS search per batch, each query answered as it is alone.
"""
from __future__ import annotations

import base64
import binascii

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..search.engine import Hit, NotFound, Query, QueryError, VectorQuery
from .common import Served, ServeState, TooLarge, decode_upload, too_large_in
from .models import KnnRequest, MetadataRequest, parse

DEDUP_COSINE = 0.94  # clip-retrieval's threshold
SKIPPED_HEADER = "X-Foco-Skipped"


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


def skipped(body: KnnRequest) -> list[str]:
    """The fields of `body` that ask for a model foco does not have (clip_back skips them without one)."""
    asked = [name for name in ("use_safety_model", "use_violence_detector", "use_mclip") if getattr(body, name)]
    return asked + (["aesthetic_score"] if body.aesthetic_score is not None else [])


def register(app: FastAPI, st: ServeState) -> None:
    limits = st.limits

    @app.get("/indices-list")
    async def indices_list():
        return list(st.indexes)

    @app.post("/metadata")
    async def metadata(request: Request):
        body = parse(MetadataRequest, await _json(request))
        served, ids = st.index(body.indice_name), body.ids
        if len(ids) > limits.max_knn:
            raise QueryError(f"at most {limits.max_knn} ids per request, got {len(ids)}")
        base = str(request.base_url).rstrip("/")
        rows = await st.on_cpu(served.engine.store.rows_by_id, ids)
        missing = next((i for i in ids if i not in rows), None)
        if missing is not None:
            raise NotFound(f"no image with id {missing} in the index {served.name!r}")
        return [{"id": i, "metadata": {"url": base + st.url("images", served, i), "caption": rows[i].path}}
                for i in ids]

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
        served = st.index(body.indice_name)
        if body.image_url:
            raise QueryError("image_url is not fetched by this server (it reaches no network); send the image "
                             "base64-encoded in 'image'")
        hits = await _search(st, served, body, num_ids)
        if body.deduplicate and len(hits) > 1:
            hits = await st.on_cpu(_dedup, served, hits)
        base = str(request.base_url).rstrip("/")
        answer = [({"id": h.id, "similarity": round(h.score, 6), "url": base + st.url("images", served, h.id),
                    "caption": h.path} if r < num_images else {"id": h.id, "similarity": round(h.score, 6)})
                  for r, h in enumerate(hits)]
        skip = skipped(body)
        return JSONResponse(answer, headers={SKIPPED_HEADER: ",".join(skip)} if skip else None)


def _dedup(served: Served, hits: list[Hit]) -> list[Hit]:
    """`dedup` over the hits' stored vectors; a hit an update removed meanwhile is left out, not an error."""
    store = served.engine.store
    slots = store.slots([h.id for h in hits])
    hits = [h for h, slot in zip(hits, slots) if slot >= 0]
    return dedup(hits, store.vectors.read(slots[slots >= 0])) if len(hits) > 1 else hits


async def _search(st: ServeState, served: Served, body: KnnRequest, num_ids: int) -> list[Hit]:
    """The hits of a /knn-service query, through the index's micro-batcher."""
    engine, limits = served.engine, st.limits
    text = body.text if body.text != "" else None  # "" is no text, as in clip_back
    if text is not None:
        engine.check_text(text)
    if body.embedding_input is not None:
        if text is not None or body.image:
            raise QueryError("give embedding_input alone: with text or image it would be dropped (clip_back would "
                             "drop it); send one query per request")
        query = VectorQuery(vector=_unit(body.embedding_input, engine.dim), k=num_ids, max_k=limits.max_knn)
    elif body.image:
        try:
            data = base64.b64decode(body.image, validate=False)
        except (ValueError, TypeError, binascii.Error):
            raise QueryError("image must be base64") from None
        image = await st.on_cpu(decode_upload, data, limits)
        if text is not None:  # a composed query: what clip-retrieval cannot do
            if num_ids > limits.max_k:
                raise QueryError(f"a composed query returns at most {limits.max_k} results (--max-k)")
            return (await served.batcher.submit(Query(text=text, reference=image, method=served.default_method(),
                                                      k=num_ids))).hits
        query = VectorQuery(image=image, k=num_ids, max_k=limits.max_knn)
    elif text is not None:
        query = VectorQuery(text=text, k=num_ids, max_k=limits.max_knn)
    else:
        raise QueryError("give one of text, image (base64) or embedding_input")
    return (await served.batcher.submit(query)).hits


def _unit(values: list, dim: int) -> np.ndarray:
    """`embedding_input` as a unit float32 direction: its dimension the index's, finite in float32, not zero."""
    vec = np.asarray(values, dtype=np.float64)  # (D,): finite numbers (KnnRequest)
    if vec.shape != (dim,):
        raise QueryError(f"embedding_input has {len(values)} values; this index holds {dim}-dimensional vectors")
    with np.errstate(over="ignore", under="ignore"):
        v32 = vec.astype(np.float32)  # what the index searches with
        norm = float(np.linalg.norm(v32.astype(np.float64)))
    if not np.all(np.isfinite(v32)):
        raise QueryError("embedding_input holds values beyond float32 (|x| > 3.4e38)")
    if not norm > 0 or not np.isfinite(norm):
        raise QueryError("embedding_input is all zeros (in float32): it has no direction to search along")
    return (v32.astype(np.float64) / norm).astype(np.float32)


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
