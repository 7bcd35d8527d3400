"""Answers composed queries over an index: reference (an indexed id or an image) + text -> ranked ids.

    engine = SearchEngine.open("runs/index", checkpoint="runs/quickstart/foco")
    hits = engine.search(Query(reference=17, text="make the circle blue", method="foco", k=10))

The query goes through the same composed-query path as evaluation: the backbone encodes the reference and the
text into `QueryBatch`, the method registered under `method` (`build_method`) composes it, FAISS ranks the
gallery, and Chord (lambda > 0) rescores a shortlist. A box on the reference is FoCo's attention bias
(`foco.model.box`), beta < 0 as chosen on val in docs/benchmarks.md ("Box anchoring").

`search_many(queries)` answers several at once (the server's micro-batches): one text encoding, one composed-query
forward and one FAISS search per method, each query answered as it would be alone. A `VectorQuery` (a text, an
image or a vector, searched as it is: clip-retrieval's /knn-service) joins the same batches: its texts and images
are encoded together and searched in the same FAISS call. Features are read from the
index's memory-mapped arrays; the image store gives each thread its own read-only SQLite connection, so lookups
(a thumbnail, a gallery page) never wait for a search. A PQ index's results are re-ranked exactly from the stored
vectors (a shortlist of refine x k, recorded with the index).

A running engine follows `foco index update` (`refresh`, which `watch` calls every second in a server): when the
update has finished, the new vector index, its settings and its count replace the old ones in one assignment
(`Loaded`), and each batch reads them once, so no batch mixes two generations. An id names a file's indexed
content: an indexed reference or a file (`file`) that changed since it was indexed is refused, whatever the
method, as its stored vector names other bytes.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..backbones import check_same_backbone, create_backbone
from ..backbones.base import ImageFeatures, TextFeatures
from ..methods import METHODS, MethodOptions, QueryBatch, build_method, served_weights
from ..methods.provenance import check_trained_on, unverified as unverified_folders
from ..utils.device import move
from ..utils.text import text_problem
from ..model.box import centre_square_mask
from ..utils.parse import MAX_CHORD
from ..utils.precision import autocast
from .build import check_files, open_image, read_meta
from .store import ImageRow, ImageStore
from .vectors import load_vector_index, search_vectors, set_search_params

DEFAULT_BOX_BETA = -8.0  # chosen on the ambiguous world benchmark's val split (docs/benchmarks.md)
CHORD_SHORTLIST = 200
SEARCH_NPROBE, SEARCH_EF = 32, 128  # IVF lists probed, HNSW's efSearch (experiments/bench_faiss.py: recall vs time)
REFRESH_EVERY_S = 1.0  # how often a watching engine looks for a finished `foco index update`


log = logging.getLogger(__name__)


class QueryError(ValueError):
    """A query the engine cannot answer as asked (unknown id, empty text, a box outside the image, ...)."""


class NotFound(QueryError):
    pass


@dataclass
class Query:
    text: str
    reference: int | Image.Image | None = None  # an indexed id, or an image
    method: str = "foco"
    k: int = 10
    box: tuple[float, float, float, float] | None = None  # (x0, y0, x1, y1) in pixels of the reference
    chord: float = 0.0  # Chord's lambda; 0: plain cosine
    keep_reference: bool = False  # by default an indexed reference is not returned as its own result


@dataclass
class VectorQuery:
    """The nearest images to one text, one image or one (D,) vector, searched as it is (no composition):
    clip-retrieval's /knn-service. `max_k` bounds k (default: the engine's limit of composed searches)."""
    text: str | None = None
    image: Image.Image | None = None
    vector: np.ndarray | None = None
    k: int = 10
    max_k: int | None = None


@dataclass
class Hit:
    id: int
    path: str
    score: float


@dataclass
class Answer:
    hits: list[Hit]
    attention: torch.Tensor | None = None  # (P,) F_Aggr's attention on the reference, for methods with one
    reference_size: tuple[int, int] | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Limits:
    max_k: int = 100
    max_text_chars: int = 1000


@dataclass(frozen=True)
class Loaded:
    """One generation of an index as an engine loaded it: its vector index, its index.json, the PQ re-rank factor,
    and the identity of the index.json it was read from. A batch reads it once, so a refresh never mixes two."""
    index: object
    meta: dict
    refine: int
    generation: tuple | None

    @classmethod
    def read(cls, folder: Path, meta: dict, generation: tuple | None) -> "Loaded":
        check_files(folder, meta)
        vec = meta.get("vectors") or {}
        index = load_vector_index(folder / "vectors.faiss", ivf=vec.get("nlist") is not None,
                                  ondisk=bool(vec.get("ondisk")))
        set_search_params(index, nprobe=SEARCH_NPROBE, ef_search=SEARCH_EF)  # approximate indexes only
        return cls(index, meta, int(vec.get("refine") or 0), generation)  # refine: PQ's shortlist factor


class SearchEngine:
    """Thread-safe: one query at a time runs the model (the server answers many clients through it)."""

    def __init__(self, folder: Path, loaded: Loaded, backbone, options: MethodOptions, limits: Limits,
                 box_beta: float = DEFAULT_BOX_BETA, model_lock: threading.RLock | None = None):
        self.folder, self.backbone, self._loaded = folder, backbone, loaded
        self.root = Path(loaded.meta["images"])
        self.options, self.limits, self.box_beta = options, limits, box_beta
        self.dim = int(loaded.meta["dim"])
        self.store = ImageStore(folder / "images.sqlite", readonly=True)  # a connection per thread, no lock
        self._lock = model_lock or threading.RLock()  # the model's forward, one at a time (shared with every
        self._methods: dict[str, object] = {}         # engine on the same backbone object)
        self._available = self._served(options)  # fixed by the weights given: not recomputed per query
        self._watcher: threading.Thread | None = None

    @property
    def index(self):
        return self._loaded.index

    @property
    def meta(self) -> dict:
        return self._loaded.meta

    @classmethod
    def open(cls, folder: str | Path, *, limits: Limits = Limits(), box_beta: float = DEFAULT_BOX_BETA,
             device: str = "cpu", backbones: dict | None = None, unverified: bool = False,
             **weights: str | Path | None) -> "SearchEngine":
        """`weights`: the served methods' weights folders by option name (`checkpoint=`, `foco_edits=`,
        `pic2word=`, ...: `MethodOption`s with a record); each is checked against the index's backbone.
        `backbones`: backbones already loaded, by spec, each with the lock its forward passes take (several
        indexes of one server share one model and its lock); the one this index needs is added to it."""
        folder = Path(folder)
        weights = {k: v for k, v in weights.items() if v not in (None, "")}  # "" (an empty shell variable): not given
        served = served_weights()
        unknown = sorted(k for k in weights if k not in served)
        if unknown:
            raise ValueError(f"no served method takes the weights {', '.join(unknown)}; served: "
                             f"{', '.join(sorted(served))}")
        if not (folder / "index.json").is_file():
            raise FileNotFoundError(f"{folder} is not an index (no index.json); make one with `foco index build`")
        generation = _generation(folder)  # before reading: an update finishing meanwhile is picked up by refresh
        meta = read_meta(folder)
        if meta.get("building"):
            raise ValueError(f"{folder}: the last `foco index build` did not finish; rerun `foco index update "
                             f"{folder}`")
        if meta.get("count") and not meta.get("backbone_sha256") and not unverified:
            raise ValueError(f"{folder / 'index.json'} records no backbone_sha256, so its vectors cannot be checked "
                             "against the backbone's weights now; rebuild it (`foco index update "
                             f"{folder} --reencode`), or pass --unverified to search it unchecked")
        shared = (backbones or {}).get(meta["backbone"])
        backbone, lock = shared or (create_backbone(meta["backbone"], device=device), threading.RLock())
        if backbones is not None:
            backbones[meta["backbone"]] = (backbone, lock)
        indexed = {"spec": meta["backbone"], "weights_sha256": meta.get("backbone_sha256")}
        fix = "build an index with that backbone (`foco index build --backbone ...`)"
        check_same_backbone(backbone, f"the backbone at {meta['backbone']} now", indexed, f"the index {folder}",
                            "rebuild the index into a new --out (`foco index build`)")
        opts = MethodOptions(backbone=backbone, device=device, unverified=unverified,
                             **{k: Path(v) for k, v in weights.items()})
        check_trained_on(opts, indexed, f"the index {folder}", fix)
        for what in unverified_folders(opts):
            log.warning("%s records no backbone: used unchecked against the index %s (--unverified)", what, folder)
        engine = cls(folder, Loaded.read(folder, meta, generation), backbone, opts, limits, box_beta, lock)
        engine.refuse_unservable()
        return engine

    def refuse_unservable(self) -> None:
        """At startup: a method whose weights were given but whose queries this index cannot answer (one that reads
        the raw embedding's norm: the index stores unit vectors) is refused, with the reason (`refused`, which
        `foco serve` and `foco search` print, and a query naming it is answered with): a method listed is one every
        query of can be answered."""
        self.refused: dict[str, str] = {}
        for name in self.available_methods():
            if self._method(name).reads_norm:
                opt = next(o for o in METHODS.get(name).options if o.record)
                self.refused[name] = (f"{name} ({opt.flag} {self.options.get(opt.name)}) reads the reference's raw "
                                      f"embedding (its norm), which the index {self.folder} does not store (it keeps "
                                      f"unit vectors): evaluate it on a feature cache with `foco eval`")
                self._methods.pop(name, None)
        self._available = tuple(m for m in self._available if m not in self.refused)

    # --- what the index holds ------------------------------------------------------------------------------
    def count(self) -> int:
        """Images in the loaded generation of the index (the vector index's count, which `refresh` replaces
        together with the index itself)."""
        return int(self.index.ntotal)

    def refresh(self) -> bool:
        """Loads the index again when a `foco index update` has finished since it was loaded (index.json changed and
        is not marked building); True when it did. The new vector index, its settings and its count replace the old
        ones at once; a search running meanwhile finishes on the old ones."""
        old = self._loaded
        generation = _generation(self.folder)
        if generation == old.generation or generation is None:
            return False
        try:
            meta = read_meta(self.folder)
        except ValueError as exc:  # damaged since: the loaded generation stays
            log.warning("%s; the server keeps the index it loaded", exc)
            return False
        if meta.get("building"):
            return False  # an update in progress: the loaded generation stays until it finishes
        if any(meta.get(k) != old.meta.get(k) for k in ("backbone", "backbone_sha256", "dim", "images")):
            log.warning("%s was rebuilt with other backbone weights, dimension or folder; the server keeps the index "
                        "it loaded: restart it to serve the new one", self.folder)
            self._loaded = Loaded(old.index, old.meta, old.refine, generation)
            return False
        try:
            loaded = Loaded.read(self.folder, meta, generation)
        except (OSError, ValueError, RuntimeError) as exc:  # damaged since, or a half-copied update
            log.warning("%s; the server keeps the index it loaded", exc)
            return False
        self._loaded = loaded  # one assignment: a batch sees one or the other
        log.info("%s: loaded the updated index (%d images)", self.folder, self.count())
        return True

    def watch(self, every_s: float = REFRESH_EVERY_S) -> None:
        """Calls `refresh` every `every_s` seconds in a daemon thread (once per engine; a server's)."""
        if self._watcher is not None:
            return

        def loop():
            while True:
                time.sleep(every_s)
                try:
                    self.refresh()
                except Exception as exc:  # an index.json caught mid-write, a missing file: tried again next time
                    log.warning("%s: could not load the updated index yet (%s)", self.folder, exc)
        self._watcher = threading.Thread(target=loop, name=f"foco-watch-{self.folder.name}", daemon=True)
        self._watcher.start()

    def row(self, image_id: int) -> ImageRow:
        if not 0 <= int(image_id) < 2 ** 63:  # SQLite's integers are int64
            raise NotFound(f"no image with id {image_id} in this index")
        r = self.store.row(int(image_id))
        if r is None:
            raise NotFound(f"no image with id {image_id} in this index")
        return r

    def page(self, offset: int, limit: int) -> list[ImageRow]:
        return self.store.page(offset, limit)

    def gallery(self, offset: int, limit: int) -> tuple[int, list[ImageRow]]:
        """(images in the index, a page of their rows), both from one snapshot of the image store."""
        return self.store.snapshot(offset, limit)

    def file(self, image_id: int) -> Path:
        """The indexed file of `image_id`, only ever inside the indexed folder, and only as it was indexed: an id
        names the file's indexed content, so a changed file is served under the id `foco index update` gives it."""
        row = self.row(image_id)
        if self.meta.get("source") == "shards":
            raise NotFound(f"image {image_id} lies inside a tar shard of {self.root}, not in a file of its own")
        path = (self.root / row.path).resolve()
        if not path.is_relative_to(self.root.resolve()) or not path.is_file():
            raise NotFound(f"image {image_id} is no longer on disk; run `foco index update`")
        if not self._current(row):
            raise NotFound(f"image {image_id} changed since it was indexed; run `foco index update {self.folder}`")
        return path

    def available_methods(self) -> list[str]:
        """Methods this server can run, each in the registry's order: the served ones whose weights folders were
        given and that read the reference's patches (FoCo's family, which the box steers), then the training-free
        ones, then the other trained ones. The first is the server's default method."""
        return list(self._available)

    @staticmethod
    def _served(options: MethodOptions) -> tuple[str, ...]:
        patches, free, other = [], [], []
        for name in METHODS.names():
            cls = METHODS.get(name)
            weights = [o.name for o in cls.options if o.record]
            if cls.served and all(options.get(w) is not None for w in weights):
                (free if not weights else patches if cls.reads_patches else other).append(name)
        return tuple(patches + free + other)

    # --- queries ---------------------------------------------------------------------------------------------
    def _method(self, name: str):
        if name in getattr(self, "refused", {}):
            raise QueryError(f"method {name!r} is refused on this index: {self.refused[name]}")
        if name not in self.available_methods():
            need = [o.flag for o in METHODS.get(name).options if o.record] if name in METHODS.names() else []
            raise QueryError(f"method {name!r} is not available here; choose from {self.available_methods()}"
                             + (f" ({name} needs {' '.join(need)})" if need and METHODS.get(name).served else ""))
        if name not in self._methods:
            self._methods[name] = build_method(name, opts=self.options)
        return self._methods[name]

    def check_text(self, text: object) -> None:
        """The one text rule of every query (composed or not): `foco.utils.text`, within the length limit."""
        problem = text_problem(text, max_chars=self.limits.max_text_chars)
        if problem:
            example = ": give the modification, e.g. 'make the dress red'" if problem.startswith("is empty") else ""
            raise QueryError(f"text {problem}{example}")

    def _check(self, q: Query) -> None:
        self.check_text(q.text)
        if not 1 <= q.k <= self.limits.max_k:
            raise QueryError(f"k must be between 1 and {self.limits.max_k}, got {q.k}")
        if not 0 <= q.chord <= MAX_CHORD:
            raise QueryError(f"chord lambda must be between 0 and {MAX_CHORD:g}, got {q.chord:g}")
        if q.reference is None:
            raise QueryError("a reference image is required: an indexed id or an uploaded image")

    def _encode_image(self, image: Image.Image) -> ImageFeatures:
        return self._encode_images([image])

    def _encode_images(self, images: list[Image.Image]) -> ImageFeatures:
        """(n, D) globals and (n, P, D) patches of images, float32."""
        with self._lock, torch.inference_mode(), autocast(self.meta.get("precision", "fp32")):
            f = self.backbone.encode_images([im.convert("RGB") for im in images])
        return ImageFeatures(f.global_.float(), f.patches.float())

    def encode_text(self, text: str) -> TextFeatures:
        return self.encode_texts([text])

    def encode_texts(self, texts: list[str]) -> TextFeatures:
        with self._lock, torch.inference_mode(), autocast(self.meta.get("precision", "fp32")):
            f = self.backbone.encode_texts(list(texts))
        return TextFeatures(f.global_.float(), f.tokens.float(), f.mask)

    def search(self, q: Query) -> Answer:
        out = self.search_many([q])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def search_many(self, queries: list[Query | VectorQuery]) -> list[Answer | QueryError]:
        """Several queries at once: per method, one text encoding, one reference encoding (of the references whose
        features are not stored), one composed-query forward and one FAISS search; the `VectorQuery`s together,
        one text and one image encoding and one FAISS search. Each query gets the answer `search` gives it alone,
        or its own QueryError; one bad query fails no other."""
        out: list[Answer | QueryError | None] = [None] * len(queries)
        groups: dict[str, list[int]] = {}
        plain = [i for i, q in enumerate(queries) if isinstance(q, VectorQuery)]
        if plain:
            for i, a in zip(plain, self._vector_group([queries[i] for i in plain])):
                out[i] = a
        for i, q in enumerate(queries):
            if isinstance(q, VectorQuery):
                continue
            try:
                self._check(q)
                self._method(q.method)
                groups.setdefault(q.method, []).append(i)
            except QueryError as exc:
                out[i] = exc
        for name, idx in groups.items():
            for i, a in zip(idx, self._search_group(name, [queries[i] for i in idx])):
                out[i] = a
        return out  # type: ignore[return-value]

    def _search_group(self, name: str, qs: list[Query]) -> list[Answer | QueryError]:
        method = self._method(name)
        reads_patches, reads_anchor = METHODS.get(name).reads_patches, METHODS.get(name).reads_anchor
        reads_box = METHODS.get(name).reads_box  # AdaFocal: the box itself, its beta the method's own
        out: list[Answer | QueryError | None] = [None] * len(qs)
        glob: dict[int, torch.Tensor] = {}  # query -> (D,) reference global
        patches: dict[int, torch.Tensor] = {}  # query -> (P, D)
        size: dict[int, tuple[int, int]] = {}
        encode: list[tuple[int, Image.Image]] = []  # references whose features are computed now
        for i, q in enumerate(qs):
            try:
                if q.box is not None and not (reads_anchor or reads_box):
                    raise QueryError(f"a box steers F_Aggr's attention (foco, adafocal); method {q.method!r} has none")
                if isinstance(q.reference, Image.Image):
                    encode.append((i, q.reference))
                    size[i] = q.reference.size
                    continue
                row = self.row(int(q.reference))
                if not self._current(row):  # every method: the stored global names the file as it was indexed
                    raise NotFound(f"image {row.id} changed or was deleted since it was indexed; run `foco index "
                                   f"update {self.folder}`")
                size[i] = (row.width, row.height)
                glob[i] = torch.from_numpy(self.store.vector_rows([row.id])[0])
                if reads_patches:
                    stored = self.store.patch_rows(row.id)
                    if stored is not None:
                        patches[i] = torch.from_numpy(stored)
                    else:
                        try:
                            encode.append((i, self._row_image(row)))
                        except ValueError as exc:  # the file changed into something unreadable since it was indexed
                            raise NotFound(f"image {row.id} cannot be read any more ({exc}); run `foco index "
                                           "update`") from None
            except QueryError as exc:
                out[i] = exc
        if encode:
            f = self._encode_images([im for _, im in encode])
            for j, (i, _) in enumerate(encode):
                glob.setdefault(i, f.global_[j])  # an indexed reference keeps its stored global
                patches[i] = f.patches[j]
        boxes: dict[int, torch.Tensor] = {}
        for i, q in enumerate(qs):
            if out[i] is None and q.box is not None:
                try:
                    boxes[i] = self._box_mask(q.box, size[i], patches[i].shape[0])[0]  # (P,) bool
                except QueryError as exc:
                    out[i] = exc
        ok = [i for i in range(len(qs)) if out[i] is None]
        if not ok:
            return out  # type: ignore[return-value]
        ref_g = torch.stack([glob[i] for i in ok])  # (b, D)
        ref_p = torch.stack([patches[i] for i in ok]) if reads_patches else \
            torch.empty(len(ok), 0, self.dim, device=ref_g.device)
        attn_bias = box_mask = None
        if boxes:
            box_mask = torch.zeros(len(ok), ref_p.shape[1], dtype=torch.bool, device=ref_g.device)  # (b, P)
            for j, i in enumerate(ok):
                if i in boxes:
                    box_mask[j] = boxes[i]
            if reads_box:  # AdaFocal predicts its beta from the query
                attn_bias = None
            else:  # FoCo: the server's fixed beta inside the box, 0 elsewhere
                attn_bias, box_mask = self.box_beta * box_mask.float(), None
        texts = [qs[i].text for i in ok]
        batch = QueryBatch(reference=ImageFeatures(ref_g, ref_p), modification=self.encode_texts(texts),
                           texts=texts, attn_bias=attn_bias, box_mask=box_mask)
        batch = move(batch, method.device)  # the method's encoder runs on --device
        with self._lock, torch.inference_mode():
            composed = method.encode(batch)
        query = composed.query.float().cpu()  # (b, D): the vector index searches on the CPU
        exclude = [None if isinstance(qs[i].reference, Image.Image) or qs[i].keep_reference else int(qs[i].reference)
                   for i in ok]
        gen = self._loaded  # one generation for the whole batch
        depths = [self._depth(qs[i].k, qs[i].chord, exclude[j] is not None, gen) for j, i in enumerate(ok)]
        found = self._search_depths(query, depths, gen)
        for j, i in enumerate(ok):
            scores, ids = found[j]
            hits = self._hits(query[j:j + 1], scores, ids, ref_g[j:j + 1], qs[i].k, qs[i].chord, exclude[j], gen)
            attention = composed.attention[j].cpu() if composed.attention is not None else None
            out[i] = Answer(hits, attention, size[i])
        return out  # type: ignore[return-value]

    def search_vector(self, vector: np.ndarray, k: int, max_k: int | None = None) -> list[Hit]:
        """Nearest images to a (D,) vector (clip-retrieval's embedding_input); k at most `max_k` (default: the
        limit of composed searches)."""
        out = self._vector_group([VectorQuery(vector=vector, k=k, max_k=max_k)])[0]
        if isinstance(out, Exception):
            raise out
        return out.hits

    def _vector_group(self, qs: list[VectorQuery]) -> list[Answer | QueryError]:
        """`VectorQuery`s: their texts in one encoding, their images in another, then one FAISS search per depth."""
        out: list[Answer | QueryError | None] = [None] * len(qs)
        vecs: dict[int, torch.Tensor] = {}  # query -> (D,) float32
        texts, images = [], []
        for i, q in enumerate(qs):
            try:
                max_k = q.max_k or self.limits.max_k
                if not 1 <= q.k <= max_k:
                    raise QueryError(f"k must be between 1 and {max_k}, got {q.k}")
                if sum(x is not None for x in (q.text, q.image, q.vector)) != 1:
                    raise QueryError("give exactly one of a text, an image or a vector")
                if q.text is not None:
                    self.check_text(q.text)
                    texts.append(i)
                elif q.image is not None:
                    images.append(i)
                else:
                    v = np.asarray(q.vector)
                    if v.shape != (self.dim,):
                        raise QueryError(f"the embedding has {v.shape[0] if v.ndim == 1 else v.shape} values; this "
                                         f"index holds {self.dim}-dimensional vectors")
                    vecs[i] = torch.from_numpy(v.astype(np.float32))
            except QueryError as exc:
                out[i] = exc
        if texts:
            g = self.encode_texts([qs[i].text for i in texts]).global_  # (t, D)
            vecs.update({i: g[j] for j, i in enumerate(texts)})
        if images:
            g = self._encode_images([qs[i].image for i in images]).global_  # (m, D)
            vecs.update({i: g[j] for j, i in enumerate(images)})
        ok = sorted(vecs)
        if not ok:
            return out  # type: ignore[return-value]
        query = torch.nn.functional.normalize(torch.stack([vecs[i] for i in ok]).float(), dim=-1)  # (b, D)
        gen = self._loaded  # one generation for the whole batch
        found = self._search_depths(query, [self._depth(qs[i].k, 0.0, False, gen) for i in ok], gen)
        for j, i in enumerate(ok):
            scores, ids = found[j]
            out[i] = Answer(self._hits(query[j:j + 1], scores, ids, None, qs[i].k, 0.0, None, gen))
        return out  # type: ignore[return-value]

    def _box_mask(self, box, size: tuple[int, int], num_patches: int) -> torch.Tensor:
        """(1, P) bool: the patches inside `box` (pixels of the W x H reference), on the patch grid of the centre
        square the backbone sees (`foco.model.box.centre_square_mask`, as evaluation maps a box); on the CPU beside
        the stored and encoded features."""
        x0, y0, x1, y1 = (float(v) for v in box)
        W, H = size
        if not (0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H):
            raise QueryError(f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) is not inside the {W} x {H} reference "
                             "(x0 < x1, y0 < y1, in pixels)")
        mask = centre_square_mask(torch.tensor([[x0, y0, x1, y1]], device="cpu"),
                                  torch.tensor([[W, H]], dtype=torch.float32, device="cpu"), num_patches)
        if not mask.any():  # too small, or outside the centre square: never silently no box
            raise QueryError(f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) is too small to cover any patch of the centre "
                             f"square the backbone sees of the {W} x {H} reference, or lies outside it; draw a larger "
                             "box, or one nearer the centre")
        return mask

    @staticmethod
    def _depth(k: int, chord: float, excludes: bool, gen: Loaded) -> int:
        """How deep FAISS searches for one query: k, one more for an excluded reference, Chord's shortlist, and a PQ
        index's re-rank shortlist."""
        depth = k + excludes
        depth = max(depth, CHORD_SHORTLIST) if chord > 0 else depth
        return depth * gen.refine if gen.refine else depth

    @staticmethod
    def _search_depths(queries: torch.Tensor, depths: list[int], gen: Loaded) -> list[tuple[np.ndarray, np.ndarray]]:
        """One FAISS search per distinct depth over the queries (b, D) that need it; (scores, ids) per query."""
        out: list = [None] * len(depths)
        for depth in sorted(set(depths)):
            rows = [j for j, d in enumerate(depths) if d == depth]
            scores, ids = search_vectors(gen.index, queries[rows].numpy(), depth)
            for r, j in enumerate(rows):
                out[j] = (scores[r], ids[r])
        return out

    def _hits(self, query: torch.Tensor, scores: np.ndarray, ids: np.ndarray, reference: torch.Tensor | None,
              k: int, chord: float, exclude: int | None, gen: Loaded) -> list[Hit]:
        """The top k of one query's FAISS results, the reference left out, re-ranked by the exact stored vectors (a
        PQ index) or by Chord (lambda > 0)."""
        keep = (ids >= 0) & (ids != (exclude if exclude is not None else -2))
        scores, ids = scores[keep], ids[keep]
        slots = self.store.slots(ids)  # an id an update removed after this server loaded its index: left out
        scores, ids, slots = scores[slots >= 0], ids[slots >= 0], slots[slots >= 0]
        if (gen.refine or chord > 0) and len(ids):
            vecs = torch.from_numpy(self.store.vectors.read(slots))  # (n, D) the stored vectors, exact values
            if chord > 0 and reference is not None:
                from ..eval.chord import chord_scores_candidates
                s = chord_scores_candidates(query, vecs[None], reference, chord)[0].numpy()
            else:
                s = (vecs @ query[0].float()).numpy()
            order = np.argsort(-s, kind="stable")
            scores, ids = s[order], ids[order]
        hits, stale = [], 0
        for start in range(0, len(ids), k):  # rows read k at a time: more only when a file went stale
            rows = self.store.rows_by_id(ids[start:start + k].tolist())
            for s, i in zip(scores[start:start + k].tolist(), ids[start:start + k].tolist()):
                row = rows.get(int(i))
                if row is None:
                    continue
                if not self._current(row):
                    stale += 1
                    continue
                hits.append(Hit(int(i), row.path, float(s)))
            if len(hits) >= k:
                break
        hits = hits[:k]
        if stale:
            log.warning("%d indexed files changed or were deleted since indexing and were left out of the results; "
                        "run `foco index update %s`", stale, self.folder)
        return hits

    def _row_image(self, row) -> Image.Image:
        """The indexed image of `row`, decoded: its file, or its bytes inside a tar shard (`shards.open_sample`)."""
        if self.meta.get("source") != "shards":
            return open_image(self.file(row.id))
        from .shards import open_sample
        sample = self.store.samples([row.id]).get(row.id)
        if sample is None:
            raise NotFound(f"image {row.id} records no place in its shard; rebuild the index into a new --out")
        try:
            return open_sample(self.meta["images"], row, sample[0])
        except FileNotFoundError as exc:
            raise NotFound(f"image {row.id}: {exc}") from None

    def _current(self, row) -> bool:
        """Whether the file of `row` is still what was indexed (size and mtime): a file changed or deleted since is
        never served with its old vector (`foco index update` re-encodes or removes it). A sample of a shard-built
        index is its tar's bytes, read back only when asked for (`_row_image` checks their sha256)."""
        if self.meta.get("source") == "shards":
            return True
        try:
            st = os.stat(Path(self.meta["images"]) / row.path)
        except OSError:
            return False
        return st.st_size == row.size and st.st_mtime_ns == row.mtime_ns


def _generation(folder: Path) -> tuple | None:
    """What identifies the index.json an engine loaded: `foco index update` replaces the file (a new inode) when
    it starts and when it finishes. None when it cannot be read now."""
    try:
        st = os.stat(folder / "index.json")
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size
