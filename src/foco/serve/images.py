"""The page, its assets, and the indexed images: GET /, /static/{name}, /images/{id}, /thumbnails/{id},
/gallery (each of the last three takes `?indice_name=NAME` for another index than the default). Plain handlers,
run in the server's thread pool: a file read or a thumbnail never waits for a search
(searches wait on the micro-batcher, holding no thread) and reads the image store through its own connection."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from PIL import Image

from ..search.engine import NotFound
from .common import ServeState
from .models import INT64_MAX, GalleryQuery, parse

STATIC = Path(__file__).resolve().parent / "static"
THUMB_SIDE, THUMB_CACHE = 160, 4096


def image_id(value: str) -> int:
    """A path's image id: ASCII digits within int64 ("²" and "５" are digits to str.isdigit, and are refused)."""
    if not (value.isascii() and value.isdigit()) or len(value) > 19 or int(value) > INT64_MAX:
        raise NotFound(f"no image with id {value!r}: images are addressed by their integer id")
    return int(value)


def thumbnail_png(path: Path) -> bytes:
    from ..search.build import open_image
    im = open_image(path)
    im.thumbnail((THUMB_SIDE, THUMB_SIDE), Image.NEAREST if max(im.size) <= THUMB_SIDE else Image.BICUBIC)
    if max(im.size) < THUMB_SIDE:  # tiny images (the world's 64 x 64) are scaled up, pixel-sharp
        s = THUMB_SIDE / max(im.size)
        im = im.resize((max(1, round(im.width * s)), max(1, round(im.height * s))), Image.NEAREST)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def register(app: FastAPI, st: ServeState) -> None:

    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        files = {p.name: p for p in STATIC.iterdir() if p.is_file()}  # a fixed set: no client path is joined
        if name not in files:
            return JSONResponse({"error": "no such asset"}, status_code=404)
        media = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml",
                 ".png": "image/png"}.get(files[name].suffix, "application/octet-stream")
        return FileResponse(files[name], media_type=media)

    @app.get("/images/{image}")
    def image(image: str, indice_name: Optional[str] = None):
        path = st.index(indice_name).engine.file(image_id(image))
        return FileResponse(path, media_type=_mime(path))

    @app.get("/thumbnails/{image}")
    def thumbnail(image: str, indice_name: Optional[str] = None):
        served, i = st.index(indice_name), image_id(image)
        path = served.engine.file(i)  # first: a removed or changed file is never served from the cache
        data = st.thumbs.get((served.name, i))
        if data is None:
            try:
                data = thumbnail_png(path)
            except ValueError as exc:
                raise NotFound(f"image {i} cannot be read any more ({exc}); run `foco index update`") from None
            st.thumbs[(served.name, i)] = data
            while len(st.thumbs) > THUMB_CACHE:
                st.thumbs.popitem(last=False)
        return Response(data, media_type="image/png")

    @app.get("/gallery")
    def gallery(request: Request):
        q = parse(GalleryQuery, dict(request.query_params))
        served = st.index(q.indice_name)
        total, rows = served.engine.gallery(q.offset, q.limit)  # one generation of the index: count and rows agree
        return {"total": total, "items": [{"id": r.id, "path": r.path, "width": r.width, "height": r.height,
                                           "thumbnail_url": st.url("thumbnails", served, r.id)} for r in rows]}


def _mime(path: Path) -> str:
    return {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
            ".bmp": "image/bmp"}.get(path.suffix.lower(), "application/octet-stream")
