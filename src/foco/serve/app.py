"""`foco serve`: the HTTP API and web page over a `SearchEngine` (FastAPI; `pip install foco[serve]`).

    GET  /                      the web page (every asset served from this package: no CDN)
    POST /search                multipart form: reference_id | image (file), text, k, method, box "x0,y0,x1,y1",
                                chord (lambda) -> {"results": [{id, path, score, image_url, thumbnail_url}],
                                "attention_url", "method", "k", "elapsed_ms"}
    GET  /images/{id}           an indexed file, by id only: no path from a client reaches the file system
    GET  /thumbnails/{id}       a small PNG of it
    GET  /attention/{token}     the attention heatmap of a recent search (PNG)
    GET  /gallery?offset&limit  indexed ids, for the page's picker
    GET  /healthz, GET /metrics (Prometheus text: request counts by endpoint and status, latency sums)
    POST /knn-service           clip-retrieval's back-end API (text | image (base64) | embedding_input,
                                num_images, modality), so its ClipClient can use a local foco serve
    GET  /indices-list          clip-retrieval's list of indices: ["foco"]

Limits (`ServeLimits`): upload size, pixels (Pillow's decompression-bomb guard), text length, k. Every violation
is a 4xx with {"error": message}; the server keeps serving.
"""
from __future__ import annotations

import base64
import io
import secrets
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

try:  # this module is the server: it needs the serve extra (the rest of foco does not)
    from fastapi import FastAPI, Request
    from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover
    raise ImportError("foco serve needs FastAPI and uvicorn: pip install 'foco[serve]'") from exc

from ..eval.figures import attention_overlay
from ..search.build import MAX_IMAGE_PIXELS
from ..search.engine import NotFound, Query, QueryError, SearchEngine

STATIC = Path(__file__).resolve().parent / "static"


@dataclass
class ServeLimits:
    max_upload_bytes: int = 10 * 1024 * 1024
    max_pixels: int = MAX_IMAGE_PIXELS
    max_text_chars: int = 1000
    max_k: int = 100
    attention_cache: int = 256  # recent heatmaps kept for /attention/{token}


class _Metrics:
    """Request counts and latency sums per (endpoint, status), in Prometheus' text format."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, int], int] = {}
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def record(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            self.counts[(endpoint, status)] = self.counts.get((endpoint, status), 0) + 1
            self.seconds[endpoint] = self.seconds.get(endpoint, 0.0) + seconds
            self.calls[endpoint] = self.calls.get(endpoint, 0) + 1

    def text(self, images: int) -> str:
        with self.lock:
            lines = ["# HELP foco_requests_total HTTP requests by endpoint and status.",
                     "# TYPE foco_requests_total counter"]
            lines += [f'foco_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.counts.items())]
            lines += ["# HELP foco_request_seconds Time spent answering requests, by endpoint.",
                      "# TYPE foco_request_seconds summary"]
            for e in sorted(self.calls):
                lines += [f'foco_request_seconds_sum{{endpoint="{e}"}} {self.seconds[e]:.6f}',
                          f'foco_request_seconds_count{{endpoint="{e}"}} {self.calls[e]}']
            lines += ["# HELP foco_indexed_images Images in the served index.", "# TYPE foco_indexed_images gauge",
                      f"foco_indexed_images {images}"]
        return "\n".join(lines) + "\n"


def decode_upload(data: bytes, limits: ServeLimits) -> Image.Image:
    """An uploaded image, decoded under the pixel cap; QueryError (-> 400/413) for anything else."""
    if len(data) > limits.max_upload_bytes:
        raise _TooLarge(f"the upload has {len(data)} bytes; at most {limits.max_upload_bytes}")
    if not data:
        raise QueryError("the uploaded file is empty")
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = limits.max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                if im.width * im.height > limits.max_pixels:
                    raise _TooLarge(f"the image is {im.width} x {im.height} pixels; at most {limits.max_pixels}")
                from PIL import ImageOps
                return ImageOps.exif_transpose(im).convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _TooLarge(f"the image has too many pixels ({exc})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, QueryError):
            raise
        raise QueryError(f"the upload is not a readable image ({type(exc).__name__})") from None
    finally:
        Image.MAX_IMAGE_PIXELS = old


class _TooLarge(QueryError):
    pass


def _parse_box(box: str | None) -> tuple[float, float, float, float] | None:
    if box is None or not box.strip():
        return None
    try:
        vals = [float(v) for v in box.split(",")]
    except ValueError:
        raise QueryError(f"box must be four numbers x0,y0,x1,y1, got {box!r}") from None
    if len(vals) != 4 or not all(np.isfinite(vals)):
        raise QueryError(f"box must be four finite numbers x0,y0,x1,y1, got {box!r}")
    return tuple(vals)  # type: ignore[return-value]


def _parse_int(value, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise QueryError(f"{name} must be an integer, got {value!r}") from None


def _parse_float(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise QueryError(f"{name} must be a number, got {value!r}") from None
    if not np.isfinite(v):
        raise QueryError(f"{name} must be finite, got {value!r}")
    return v


def create_app(engine: SearchEngine, limits: ServeLimits = ServeLimits()) -> FastAPI:
    engine.limits.max_k, engine.limits.max_text_chars = limits.max_k, limits.max_text_chars
    app = FastAPI(title="foco", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = _Metrics()
    heatmaps: OrderedDict[str, bytes] = OrderedDict()
    heat_lock = threading.Lock()
    thumbs: OrderedDict[int, bytes] = OrderedDict()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.middleware("http")
    async def count(request: Request, call_next):
        t0 = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:  # never reached for handled errors; keeps the count honest for the rest
            metrics.record(_endpoint(request), 500, time.perf_counter() - t0)
            raise
        metrics.record(_endpoint(request), response.status_code, time.perf_counter() - t0)
        return response

    def _endpoint(request: Request) -> str:
        route = request.scope.get("route")
        return getattr(route, "path", "other")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(QueryError)
    async def query_error(request: Request, exc: QueryError):
        status = 404 if isinstance(exc, NotFound) else 413 if isinstance(exc, _TooLarge) else 400
        return error(status, str(exc))

    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        files = {p.name: p for p in STATIC.iterdir() if p.is_file()}  # a fixed set: no client path is joined
        if name not in files:
            return error(404, "no such asset")
        media = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml",
                 ".png": "image/png"}.get(files[name].suffix, "application/octet-stream")
        return FileResponse(files[name], media_type=media)

    @app.get("/healthz")
    def healthz():
        return {"status": "ok", "images": engine.count(), "methods": engine.available_methods(),
                "backbone": engine.meta["backbone"], "max_k": limits.max_k, "max_text_chars": limits.max_text_chars,
                "max_upload_bytes": limits.max_upload_bytes}

    @app.get("/metrics")
    def prometheus():
        return PlainTextResponse(metrics.text(engine.count()), media_type="text/plain; version=0.0.4")

    def _image_id(value: str) -> int:
        if not value.isdigit() or len(value) > 18:
            raise NotFound(f"no image with id {value!r}: images are addressed by their integer id")
        return int(value)

    @app.get("/images/{image_id}")
    def image(image_id: str):
        path = engine.file(_image_id(image_id))
        return FileResponse(path, media_type=_mime(path))

    @app.get("/thumbnails/{image_id}")
    def thumbnail(image_id: str):
        i = _image_id(image_id)
        data = thumbs.get(i)
        if data is None:
            from ..search.build import open_image
            try:
                im = open_image(engine.file(i))
            except ValueError as exc:
                raise NotFound(f"image {i} cannot be read any more ({exc}); run `foco index update`") from None
            im.thumbnail((160, 160), Image.NEAREST if max(im.size) <= 160 else Image.BICUBIC)
            if max(im.size) < 160:  # tiny images (the world's 64 x 64) are scaled up, pixel-sharp
                s = 160 / max(im.size)
                im = im.resize((max(1, round(im.width * s)), max(1, round(im.height * s))), Image.NEAREST)
            buf = io.BytesIO()
            im.save(buf, format="PNG")
            data = buf.getvalue()
            thumbs[i] = data
            while len(thumbs) > 4096:
                thumbs.popitem(last=False)
        return Response(data, media_type="image/png")

    @app.get("/attention/{token}")
    def attention(token: str):
        with heat_lock:
            data = heatmaps.get(token)
        if data is None:
            return error(404, "no such heatmap (they are kept for the most recent searches only)")
        return Response(data, media_type="image/png")

    @app.get("/gallery")
    def gallery(offset: str = "0", limit: str = "60"):
        off, lim = _parse_int(offset, "offset"), _parse_int(limit, "limit")
        if off < 0 or not 1 <= lim <= 500:
            raise QueryError("offset must be >= 0 and limit between 1 and 500")
        rows = engine.page(off, lim)
        return {"total": engine.count(), "items": [{"id": r.id, "path": r.path, "width": r.width,
                                                    "height": r.height, "thumbnail_url": f"/thumbnails/{r.id}"}
                                                   for r in rows]}

    @app.post("/search")
    async def search(request: Request):
        t0 = time.perf_counter()
        size = int(request.headers.get("content-length") or 0)
        if size > limits.max_upload_bytes + 64 * 1024:
            raise _TooLarge(f"the request has {size} bytes; uploads are capped at {limits.max_upload_bytes}")
        try:
            form = await request.form(max_files=1, max_fields=16)
        except Exception as exc:  # malformed multipart, too many parts
            raise QueryError(f"the request is not a valid form ({type(exc).__name__}: {exc})") from None
        text = form.get("text")
        if text is not None and not isinstance(text, str):
            raise QueryError("text must be a form field, not a file")
        upload = form.get("image")
        ref_id = form.get("reference_id")
        if upload is not None and not isinstance(upload, str) and getattr(upload, "filename", None) is not None:
            data = await upload.read(limits.max_upload_bytes + 1)
            reference = decode_upload(data, limits)
        elif ref_id not in (None, ""):
            reference = _parse_int(ref_id, "reference_id")
        else:
            raise QueryError("give a reference: reference_id (an indexed id) or image (an uploaded file)")
        q = Query(text=text or "", reference=reference, method=str(form.get("method") or _default_method()),
                  k=_parse_int(form.get("k") or 10, "k"), box=_parse_box(form.get("box")),
                  chord=_parse_float(form.get("chord") or 0, "chord"))
        answer = await _run(engine.search, q)
        token = None
        if answer.attention is not None:
            ref_img = reference if isinstance(reference, Image.Image) else None
            token = _store_heatmap(ref_img if ref_img is not None else q.reference, answer.attention)
        return {"results": [{"id": h.id, "path": h.path, "score": round(h.score, 6), "image_url": f"/images/{h.id}",
                             "thumbnail_url": f"/thumbnails/{h.id}"} for h in answer.hits],
                "attention_url": f"/attention/{token}" if token else None, "method": q.method, "k": q.k,
                "reference_size": list(answer.reference_size) if answer.reference_size else None,
                "elapsed_ms": round(1000 * (time.perf_counter() - t0), 1)}

    def _default_method() -> str:
        return engine.available_methods()[0]

    def _store_heatmap(reference, attention) -> str:
        from ..search.build import open_image
        im = reference if isinstance(reference, Image.Image) else open_image(engine.file(int(reference)))
        side = 256
        overlay = attention_overlay(im, attention, side)
        buf = io.BytesIO()
        overlay.save(buf, format="PNG")
        token = secrets.token_urlsafe(12)
        with heat_lock:
            heatmaps[token] = buf.getvalue()
            while len(heatmaps) > limits.attention_cache:
                heatmaps.popitem(last=False)
        return token

    @app.get("/indices-list")
    def indices_list():
        return ["foco"]

    @app.post("/knn-service")
    async def knn_service(request: Request):
        try:
            body = await request.json()
        except Exception:
            raise QueryError("the body must be JSON (clip-retrieval's knn-service request)") from None
        if not isinstance(body, dict):
            raise QueryError("the body must be a JSON object")
        k = _parse_int(body.get("num_images", 40), "num_images")
        modality = body.get("modality", "image")
        if modality != "image":
            raise QueryError("this index holds images only: modality must be 'image'")
        if body.get("image_url"):
            raise QueryError("image_url is not fetched by this server (it reaches no network); send the image "
                             "base64-encoded in 'image'")
        text, image_b64, emb = body.get("text"), body.get("image"), body.get("embedding_input")
        if emb is not None:
            vec = np.asarray(emb, dtype=np.float64)
            if vec.ndim != 1 or not np.all(np.isfinite(vec)):
                raise QueryError("embedding_input must be a list of finite numbers")
            hits = await _run(engine.search_vector, vec, k)
        elif image_b64:
            try:
                data = base64.b64decode(image_b64, validate=False)
            except (ValueError, TypeError):
                raise QueryError("image must be base64") from None
            image = decode_upload(data, limits)
            if text:  # a composed query: what clip-retrieval cannot do
                hits = (await _run(engine.search, Query(text=str(text), reference=image,
                                                        method=_default_method(), k=k))).hits
            else:
                vec = engine._encode_image(image).global_[0].numpy()
                hits = await _run(engine.search_vector, vec, k)
        elif text:
            if not isinstance(text, str) or len(text) > limits.max_text_chars:
                raise QueryError(f"text must be a string of at most {limits.max_text_chars} characters")
            vec = engine.encode_text(text).global_[0].numpy()
            hits = await _run(engine.search_vector, vec, k)
        else:
            raise QueryError("give one of text, image (base64) or embedding_input")
        base = str(request.base_url).rstrip("/")
        return [{"id": h.id, "similarity": round(h.score, 6), "url": f"{base}/images/{h.id}", "caption": h.path}
                for h in hits]

    return app


async def _run(fn, *args):
    import anyio
    return await anyio.to_thread.run_sync(lambda: fn(*args))


def _mime(path: Path) -> str:
    return {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
            ".bmp": "image/bmp"}.get(path.suffix.lower(), "application/octet-stream")
