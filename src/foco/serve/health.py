"""GET /healthz and GET /metrics: answered on the event loop from memory alone (no lock, no thread, no disk), so
they never wait behind a search, an upload or a thumbnail."""
from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from .common import ServeState


def register(app: FastAPI, st: ServeState) -> None:
    limits = st.limits

    @app.get("/healthz")
    async def healthz():
        """The default index's images, methods and backbone, then every index's (`indexes`), and the limits."""
        engine = st.engine
        return {"status": "ok", "images": engine.count(), "methods": engine.available_methods(),
                "backbone": engine.meta["backbone"], "index": st.default.name,
                "indexes": {n: {"images": s.engine.count(), "methods": s.engine.available_methods(),
                                "backbone": s.engine.meta["backbone"]} for n, s in st.indexes.items()},
                "max_k": limits.max_k, "max_text_chars": limits.max_text_chars,
                "max_upload_bytes": limits.max_upload_bytes, "max_knn": limits.max_knn, "pid": os.getpid()}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(st.metrics.text(st.indexes), media_type="text/plain; version=0.0.4")
