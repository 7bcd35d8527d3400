"""POST /search (a composed query, through the micro-batcher) and GET /attention/{token} (its heatmap).

    POST /search   multipart form: reference_id | image (file), text, k, method, box "x0,y0,x1,y1", chord (lambda,
                   0-100), indice_name (one of the served indexes; default the first)
                   -> {"results": [{id, path, score, image_url, thumbnail_url}], "attention_url", "method", "k",
                   "index", "reference_size", "elapsed_ms"}

The form is read on the event loop (it is I/O); the upload is decoded in the CPU pool; the query waits for its
batch's answer without holding a thread. A search keeps its attention and its reference; the heatmap PNG is drawn
(in the thread pool) only when /attention is asked for.
"""
from __future__ import annotations

import io
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
import torch
from PIL import Image

from ..eval.figures import attention_overlay
from ..search.engine import NotFound, Query, QueryError
from .common import ServeState, TooLarge, decode_upload, parse_box, too_large_in
from .models import SearchForm, parse

HEATMAP_SIDE = 256  # = Heatmaps.side


def register(app: FastAPI, st: ServeState) -> None:
    limits = st.limits

    @app.post("/search")
    async def search(request: Request):
        t0 = time.perf_counter()
        size = int(request.headers.get("content-length") or 0)
        if size > limits.max_upload_bytes + 64 * 1024:
            raise TooLarge(f"the request has {size} bytes; uploads are capped at {limits.max_upload_bytes}")
        try:
            form = await request.form(max_files=1, max_fields=16)
        except Exception as exc:  # malformed multipart, too many parts, or a body past the cap (BodyLimit)
            if (big := too_large_in(exc)) is not None:
                raise TooLarge(str(big)) from None
            raise QueryError(f"the request is not a valid form ({type(exc).__name__}: {exc})") from None
        upload = form.get("image")
        fields = {}
        for name, value in form.multi_items():
            if name == "image":
                continue
            if not isinstance(value, str):
                raise QueryError(f"{name} must be a form field, not a file")
            if name in fields:
                raise QueryError(f"{name} is given twice")
            if value.strip() or name == "text":  # a blank field is an unset one, as the page sends them
                fields[name] = value
        f = parse(SearchForm, fields)
        served = st.index(f.indice_name)
        if upload is not None and not isinstance(upload, str) and getattr(upload, "filename", None) is not None:
            data = await upload.read(limits.max_upload_bytes + 1)
            reference = await st.on_cpu(decode_upload, data, limits)
        elif f.reference_id is not None:
            reference = f.reference_id
        else:
            raise QueryError("give a reference: reference_id (an indexed id) or image (an uploaded file)")
        q = Query(text=f.text, reference=reference, method=f.method or served.default_method(), k=f.k,
                  box=parse_box(f.box), chord=f.chord)
        answer = await served.batcher.submit(q)
        token = None
        if answer.attention is not None:  # drawn only if a client asks for it (GET /attention)
            token = st.heatmaps.put((served.name, reference), answer.attention) if isinstance(reference, int) else \
                await st.on_cpu(st.heatmaps.put, reference, answer.attention)
        return {"results": [{"id": h.id, "path": h.path, "score": round(h.score, 6),
                             "image_url": st.url("images", served, h.id),
                             "thumbnail_url": st.url("thumbnails", served, h.id)} for h in answer.hits],
                "attention_url": f"/attention/{token}" if token else None, "method": q.method, "k": q.k,
                "index": served.name,
                "reference_size": list(answer.reference_size) if answer.reference_size else None,
                "elapsed_ms": round(1000 * (time.perf_counter() - t0), 1)}

    @app.get("/attention/{token}")
    def attention(token: str):  # a plain handler: the PNG is drawn in the thread pool
        entry = st.heatmaps.entry(token)
        if entry is None:
            return JSONResponse({"error": "no such heatmap (they are kept for the most recent searches only)"},
                                status_code=404)
        reference, att = entry
        try:
            return Response(_heatmap_png(st, reference, att), media_type="image/png")
        except ValueError as exc:
            raise NotFound(f"the reference of this heatmap cannot be read any more ({exc})") from None


def _heatmap_png(st: ServeState, reference, attention) -> bytes:
    from ..search.build import open_image
    if isinstance(reference, Image.Image):
        im = reference
    else:
        name, image_id = reference
        im = open_image(st.index(name).engine.file(int(image_id)))
    buf = io.BytesIO()
    attention_overlay(im, torch.as_tensor(attention), HEATMAP_SIDE).save(buf, format="PNG")
    return buf.getvalue()
