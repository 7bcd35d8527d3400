"""`foco serve`: the HTTP API and web page over a `SearchEngine` (FastAPI; `pip install foco[serve]`).

    GET  /                      the web page (every asset served from this package: no CDN)      images.py
    GET  /images/{id}           an indexed file, by id only: no client path reaches the file system
    GET  /thumbnails/{id}       a small PNG of it
    GET  /gallery?offset&limit  indexed ids, for the page's picker
    POST /search                a composed query (multipart form), micro-batched                   search_routes.py
    GET  /attention/{token}     the attention heatmap of a recent search (PNG)
    POST /knn-service           clip-retrieval's back-end API; POST /metadata; GET /indices-list   knn.py
    GET  /healthz, GET /metrics (Prometheus text)                                                  health.py

Nothing heavy runs on the event loop: composed queries wait on the micro-batcher (`batcher.py`: one forward and
one FAISS search per batch, in its own thread), uploads are decoded and PNGs encoded in a small CPU pool, file
and thumbnail routes run in the server's thread pool, and /healthz answers from memory. Limits (`ServeLimits`):
upload size, pixels (Pillow's decompression-bomb guard), text length, k, knn counts, batch size and wait. Every
violation is a 4xx with {"error": message}; the server keeps serving.

`foco serve --workers N` runs N processes (uvicorn's workers) over the same memory-mapped index: `app_from_env`
builds each one's app from the settings the command line put in FOCO_SERVE (JSON), and heatmaps go to a folder
they share.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

try:  # this module is the server: it needs the serve extra (the rest of foco does not)
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover
    raise ImportError("foco serve needs FastAPI and uvicorn: pip install 'foco[serve]'") from exc

from ..search.engine import NotFound, QueryError, SearchEngine
from . import health, images, knn, search_routes
from .batcher import MicroBatcher, freeze_heap
from .common import BodyLimit, Heatmaps, ServeLimits, ServeState, TooLarge, body_cap, decode_upload  # noqa: F401

ENV = "FOCO_SERVE"


def create_app(engine: SearchEngine, limits: ServeLimits = ServeLimits(), heatmap_dir: Path | None = None
               ) -> FastAPI:
    engine.limits.max_k, engine.limits.max_text_chars = limits.max_k, limits.max_text_chars
    st = ServeState(engine, limits, MicroBatcher(engine.search_many, limits.max_batch, limits.max_wait_ms),
                    Heatmaps(limits.attention_cache, heatmap_dir, search_routes.HEATMAP_SIDE))
    app = FastAPI(title="foco", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.foco = st

    @app.middleware("http")
    async def count(request: Request, call_next):
        t0 = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:  # never reached for handled errors; keeps the count honest for the rest
            st.metrics.record(_endpoint(request), 500, time.perf_counter() - t0)
            raise
        st.metrics.record(_endpoint(request), response.status_code, time.perf_counter() - t0)
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        where = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()[:5])
        return JSONResponse({"error": f"invalid request: {where}"}, status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):  # a bug, not the client's: still JSON
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); the server keeps serving"},
                            status_code=500)

    @app.exception_handler(QueryError)
    async def query_error(request: Request, exc: QueryError):
        status = 404 if isinstance(exc, NotFound) else 413 if isinstance(exc, TooLarge) else 400
        return JSONResponse({"error": str(exc)}, status_code=status)

    for module in (health, images, search_routes, knn):
        module.register(app, st)
    app.add_middleware(BodyLimit, cap=body_cap(limits))
    freeze_heap()
    return app


def _endpoint(request: Request) -> str:
    return getattr(request.scope.get("route"), "path", "other")


def settings_env(index: str, engine_args: dict, limits: ServeLimits, heatmap_dir: str) -> str:
    """What `app_from_env` reads, as the value of FOCO_SERVE."""
    return json.dumps({"index": index, "engine": engine_args, "limits": asdict(limits), "heatmaps": heatmap_dir})


def app_from_env() -> FastAPI:
    """The app of one `foco serve --workers N` process (uvicorn's factory)."""
    from ..search.engine import Limits
    cfg = json.loads(os.environ[ENV])
    limits = ServeLimits(**cfg["limits"])
    engine = SearchEngine.open(cfg["index"], limits=Limits(max_k=limits.max_k, max_text_chars=limits.max_text_chars),
                               **cfg["engine"])
    return create_app(engine, limits, Path(cfg["heatmaps"]))
