"""`foco serve`: the HTTP API and web page over a `SearchEngine` (FastAPI; `pip install foco[serve]`).

    GET  /                      the web page (every asset served from this package: no CDN)      images.py
    GET  /images/{id}           an indexed file, by id only: no client path reaches the file system
    GET  /thumbnails/{id}       a small PNG of it
    GET  /gallery?offset&limit  indexed ids, for the page's picker
    POST /search                a composed query (multipart form), micro-batched                   search_routes.py
    GET  /attention/{token}     the attention heatmap of a recent search (PNG)
    POST /knn-service           clip-retrieval's back-end API, micro-batched; POST /metadata;      knn.py
                                GET /indices-list
    GET  /healthz, GET /metrics (Prometheus text)                                                  health.py

One server serves one or more named indexes (`foco serve --index NAME=FOLDER ...`, `foco.search.named`), each with
its own engine and micro-batcher; a request picks one with `indice_name` (a JSON field, a form field or a query
parameter), and the first is the default. Each engine follows `foco index update` (`SearchEngine.watch`).

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
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path

try:  # this module is the server: it needs the serve extra (the rest of foco does not)
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover
    raise ImportError("foco serve needs FastAPI and uvicorn: pip install 'foco[serve]'") from exc

from ..search.engine import NotFound, QueryError, SearchEngine
from ..search.named import check_name, index_name
from . import health, images, knn, search_routes
from .batcher import MicroBatcher, freeze_heap
from .common import (BodyLimit, Heatmaps, ServeLimits, Served, ServeState, TooLarge, body_cap,  # noqa: F401
                     decode_upload)

ENV = "FOCO_SERVE"


def create_app(engines: SearchEngine | Mapping[str, SearchEngine], limits: ServeLimits = ServeLimits(),
               heatmap_dir: Path | None = None, watch: bool = True) -> FastAPI:
    """The app over `engines`: {name: engine} in order (the first is the default), or one engine, named after its
    folder. `watch`: each engine picks up a finished `foco index update` within a second."""
    if isinstance(engines, SearchEngine):
        engines = {index_name(engines.folder): engines}
    if not engines:
        raise ValueError("create_app needs at least one index")
    indexes = {}
    for name, engine in engines.items():
        engine.limits = replace(engine.limits, max_k=limits.max_k, max_text_chars=limits.max_text_chars)  # its own
        indexes[check_name(name)] = Served(name, engine, MicroBatcher(engine.search_many, limits.max_batch,
                                                                      limits.max_wait_ms))
        if watch:
            engine.watch()
    st = ServeState(indexes, limits, Heatmaps(limits.attention_cache, heatmap_dir, search_routes.HEATMAP_SIDE))
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


def open_engines(indexes: Mapping[str, str | Path], **engine_args) -> dict[str, SearchEngine]:
    """{name: engine} over the named index folders, in order; indexes of one backbone share its model. The
    server's limits are set on each by `create_app`."""
    backbones: dict = {}
    return {name: SearchEngine.open(folder, backbones=backbones, **engine_args) for name, folder in indexes.items()}


def settings_env(indexes: Mapping[str, str | Path], engine_args: dict, limits: ServeLimits, heatmap_dir: str) -> str:
    """What `app_from_env` reads, as the value of FOCO_SERVE."""
    return json.dumps({"indexes": {n: str(f) for n, f in indexes.items()}, "engine": engine_args,
                       "limits": asdict(limits), "heatmaps": heatmap_dir})


def app_from_env() -> FastAPI:
    """The app of one `foco serve --workers N` process (uvicorn's factory)."""
    cfg = json.loads(os.environ[ENV])
    limits = ServeLimits(**cfg["limits"])
    return create_app(open_engines(cfg["indexes"], **cfg["engine"]), limits, Path(cfg["heatmaps"]))
