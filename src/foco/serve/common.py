"""What the routes of `foco serve` share: the named indexes (each an engine and its micro-batcher), limits, the
request counters, the heatmap store, request parsing, and the thread pool that decodes uploads and encodes PNGs
(never the event loop)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import io
import os
import secrets
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from ..search.build import MAX_IMAGE_PIXELS
from ..search.engine import NotFound, QueryError, SearchEngine
from .batcher import MicroBatcher


@dataclass
class ServeLimits:
    max_upload_bytes: int = 10 * 1024 * 1024
    max_pixels: int = MAX_IMAGE_PIXELS
    max_text_chars: int = 1000
    max_k: int = 100  # results of a composed search
    max_knn: int = 10_000  # num_images and num_result_ids of /knn-service (clip-retrieval's back end sets none)
    attention_cache: int = 256  # recent heatmaps kept for /attention/{token}
    max_batch: int = 32  # composed queries answered by one forward
    max_wait_ms: float = 5.0  # how long the first query of a batch waits for others


class Metrics:
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

    def text(self, indexes: "dict[str, Served]") -> str:
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
            lines += ["# HELP foco_indexed_images Images in each served index.", "# TYPE foco_indexed_images gauge"]
            lines += [f'foco_indexed_images{{index="{n}"}} {s.engine.count()}' for n, s in indexes.items()]
            lines += ["# HELP foco_search_batches_total Query batches run (composed and kNN), and the queries in them.",
                      "# TYPE foco_search_batches_total counter"]
            for n, s in indexes.items():
                lines += [f'foco_search_batches_total{{index="{n}"}} {s.batcher.batches}',
                          f'foco_search_batched_queries_total{{index="{n}"}} {s.batcher.queries}']
        return "\n".join(lines) + "\n"


class Heatmaps:
    """Recent searches' attention, by token, drawn as a PNG only when a client asks for it (GET /attention): a
    search stores its (P,) attention and its reference (an indexed id, or the upload scaled down to the heatmap's
    side), nothing more. In memory, or in `folder` when several server processes answer (a heatmap one made is then
    found by another)."""

    def __init__(self, keep: int, folder: Path | None = None, side: int = 256):
        self.keep, self.folder, self.side = keep, folder, side
        self.lock = threading.Lock()
        self.memory: OrderedDict[str, tuple] = OrderedDict()  # token -> (reference, attention (P,) float32)

    def put(self, reference, attention) -> str:
        """`reference`: the upload (an image), or (index name, id) of an indexed one."""
        token = secrets.token_urlsafe(12)
        att = np.asarray(attention, dtype=np.float32)
        if isinstance(reference, Image.Image):
            reference = reference.convert("RGB").resize((self.side, self.side), Image.NEAREST)
        if self.folder is None:
            with self.lock:
                self.memory[token] = (reference, att)
                while len(self.memory) > self.keep:
                    self.memory.popitem(last=False)
            return token
        buf = io.BytesIO()
        np.save(buf, att)
        if isinstance(reference, Image.Image):
            reference.save(self.folder / f".{token}.ref.png", format="PNG")
            os.replace(self.folder / f".{token}.ref.png", self.folder / f"{token}.ref.png")
        else:
            name, image_id = reference
            (self.folder / f"{token}.id").write_text(f"{name}\t{int(image_id)}")
        tmp = self.folder / f".{token}.npy.tmp"
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, self.folder / f"{token}.npy")  # written last: a token is complete once it exists
        self._trim()
        return token

    def _trim(self) -> None:
        files = []
        for p in self.folder.glob("*.npy"):
            try:
                files.append((p.stat().st_mtime_ns, p))
            except FileNotFoundError:  # another worker removed it meanwhile
                pass
        for _, old in sorted(files)[:-self.keep]:
            for suffix in (".npy", ".id", ".ref.png"):
                (old.parent / f"{old.stem}{suffix}").unlink(missing_ok=True)

    def entry(self, token: str):
        """(reference, attention) of `token`, or None."""
        if self.folder is None:
            with self.lock:
                return self.memory.get(token)
        if not token.replace("-", "").replace("_", "").isalnum():  # a token never names another file
            return None
        try:
            att = np.load(self.folder / f"{token}.npy")
            ref_png = self.folder / f"{token}.ref.png"
            if ref_png.is_file():
                ref = Image.open(ref_png).convert("RGB")
            else:
                name, image_id = (self.folder / f"{token}.id").read_text().split("\t")
                ref = (name, int(image_id))
        except (FileNotFoundError, ValueError, OSError):
            return None
        return ref, att


@dataclass
class Served:
    """One named index of a server: its engine, and the micro-batcher its composed and kNN queries go through."""
    name: str
    engine: SearchEngine
    batcher: MicroBatcher

    def default_method(self) -> str:
        return self.engine.available_methods()[0]


@dataclass
class ServeState:
    indexes: dict[str, Served]  # in --index order; the first is the default (the page's, and a request's without
    limits: ServeLimits         # indice_name, as clip_back takes its first)
    heatmaps: Heatmaps
    metrics: Metrics = field(default_factory=Metrics)
    thumbs: OrderedDict = field(default_factory=OrderedDict)  # (index name, id) -> PNG bytes
    cpu: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="foco-cpu"))

    @property
    def default(self) -> Served:
        return next(iter(self.indexes.values()))

    @property
    def engine(self) -> SearchEngine:  # the default index's
        return self.default.engine

    def index(self, name: str | None) -> Served:
        """The index a request names (`indice_name`); the default one when it names none."""
        if name in (None, ""):
            return self.default
        if name not in self.indexes:
            raise NotFound(f"no index named {name!r} here; /indices-list gives {list(self.indexes)}")
        return self.indexes[name]

    def url(self, kind: str, served: Served, image_id: int) -> str:
        """The path of an image's file or thumbnail (`kind`: images, thumbnails); another index than the default
        is named in the query string."""
        path = f"/{kind}/{image_id}"
        return path if served is self.default else f"{path}?indice_name={served.name}"

    async def on_cpu(self, fn, *args):
        """`fn(*args)` in the pool for uploads and PNGs: off the event loop, apart from images and searches."""
        return await asyncio.get_running_loop().run_in_executor(self.cpu, lambda: fn(*args))


class TooLarge(QueryError):
    pass


class BodyLimit:
    """ASGI middleware: a request body (chunked or not) larger than `cap` bytes stops with TooLarge (-> 413) as
    it streams in, before anything spools it to memory or disk."""

    def __init__(self, app, cap: int):
        self.app, self.cap = app, cap

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.cap:
                    raise TooLarge(f"the request body passed {self.cap} bytes; uploads are capped (--max-upload-mb)")
            return message

        await self.app(scope, limited, send)


def too_large_in(exc: BaseException) -> "TooLarge | None":
    """The TooLarge that BodyLimit raised under `exc`, where a parser or a task group wrapped it."""
    seen = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, TooLarge):
            return e
        todo += list(getattr(e, "exceptions", ())) + [x for x in (e.__cause__, e.__context__) if x is not None]
    return None


def body_cap(limits: ServeLimits) -> int:
    """The largest request body: an upload (base64 in a JSON body takes 4/3 of it) and 64 KiB for the rest."""
    return limits.max_upload_bytes * 4 // 3 + 64 * 1024


def decode_upload(data: bytes, limits: ServeLimits) -> Image.Image:
    """An uploaded image, decoded under the pixel cap; QueryError (-> 400/413) for anything else."""
    if len(data) > limits.max_upload_bytes:
        raise TooLarge(f"the upload has {len(data)} bytes; at most {limits.max_upload_bytes}")
    if not data:
        raise QueryError("the uploaded file is empty")
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = limits.max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                if im.width * im.height > limits.max_pixels:
                    raise TooLarge(f"the image is {im.width} x {im.height} pixels; at most {limits.max_pixels}")
                from PIL import ImageOps
                return ImageOps.exif_transpose(im).convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge(f"the image has too many pixels ({exc})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, QueryError):
            raise
        raise QueryError(f"the upload is not a readable image ({type(exc).__name__})") from None
    finally:
        Image.MAX_IMAGE_PIXELS = old


def parse_box(box) -> tuple[float, float, float, float] | None:
    """The form field `box`, through the one box parser (`foco.utils.parse.parse_box`, as `foco search --box`)."""
    from ..utils.parse import parse_box as parse
    if box is not None and not isinstance(box, str):
        raise QueryError("box must be a form field x0,y0,x1,y1, not a file")
    if box is None or not box.strip():
        return None
    try:
        return parse(box)
    except ValueError as exc:
        raise QueryError(f"box: {exc}") from None
