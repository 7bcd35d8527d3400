"""Answers composed queries over an index: reference (an indexed id or an image) + text -> ranked ids.

    engine = SearchEngine.open("runs/index", checkpoint="runs/quickstart/foco")
    hits = engine.search(Query(reference=17, text="make the circle blue", method="foco", k=10))

The query goes through the same composed-query path as evaluation: the backbone encodes the reference and the
text into `QueryBatch`, the method registered under `method` (`build_method`) composes it, FAISS ranks the
gallery, and Chord (lambda > 0) rescores a shortlist. A box on the reference is FoCo's attention bias
(`foco.model.box`), beta < 0 as chosen on val in docs/benchmarks.md ("Box anchoring").
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..backbones import create_backbone
from ..backbones.base import ImageFeatures, TextFeatures
from ..methods import METHODS, MethodOptions, QueryBatch, build_method
from ..model.box import box_attention_bias, patch_grid
from ..utils.io import read_json
from ..utils.precision import autocast
from .build import open_image
from .store import ImageRow, ImageStore
from .vectors import load_vector_index, search_vectors, set_search_params

DEFAULT_BOX_BETA = -8.0  # chosen on the ambiguous world benchmark's val split (docs/benchmarks.md)
CHORD_SHORTLIST = 200
SEARCH_NPROBE, SEARCH_EF = 32, 128  # IVF lists probed, HNSW's efSearch (experiments/bench_faiss.py: recall vs time)
REFINE = 4  # a PQ index's shortlist is this many times k, re-ranked by the exact stored vectors


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


class SearchEngine:
    """Thread-safe: one query at a time runs the model (the server answers many clients through it)."""

    def __init__(self, folder: Path, meta: dict, index, backbone, options: MethodOptions, limits: Limits,
                 box_beta: float = DEFAULT_BOX_BETA):
        self.folder, self.meta, self.index, self.backbone = folder, meta, index, backbone
        self.root = Path(meta["images"])
        self.options, self.limits, self.box_beta = options, limits, box_beta
        self.dim = int(meta["dim"])
        self.store = ImageStore(folder / "images.sqlite", readonly=True)  # a connection per thread, no lock
        self.refine = REFINE if (meta.get("vectors") or {}).get("refine") else 0
        self._lock = threading.RLock()  # the model's forward, one at a time
        self._methods: dict[str, object] = {}

    @classmethod
    def open(cls, folder: str | Path, checkpoint: str | Path | None = None, pic2word: str | Path | None = None,
             foco_edits: str | Path | None = None, limits: Limits = Limits(), box_beta: float = DEFAULT_BOX_BETA,
             device: str = "cpu") -> "SearchEngine":
        folder = Path(folder)
        if not (folder / "index.json").is_file():
            raise FileNotFoundError(f"{folder} is not an index (no index.json); make one with `foco index build`")
        meta = read_json(folder / "index.json")
        if meta.get("building"):
            raise ValueError(f"{folder}: the last `foco index build` did not finish; rerun `foco index update "
                             f"{folder}`")
        backbone = create_backbone(meta["backbone"], device=device)
        opts = MethodOptions(checkpoint=Path(checkpoint) if checkpoint else None,
                             pic2word=Path(pic2word) if pic2word else None,
                             foco_edits=Path(foco_edits) if foco_edits else None, backbone=backbone)
        vec = meta.get("vectors") or {}
        index = load_vector_index(folder / "vectors.faiss", ivf=vec.get("nlist") is not None,
                                  ondisk=bool(vec.get("ondisk")))
        set_search_params(index, nprobe=SEARCH_NPROBE, ef_search=SEARCH_EF)  # approximate indexes only
        return cls(folder, meta, index, backbone, opts, limits, box_beta)

    # --- what the index holds ------------------------------------------------------------------------------
    def count(self) -> int:
        return int(self.index.ntotal)

    def row(self, image_id: int) -> ImageRow:
        r = self.store.row(int(image_id))
        if r is None:
            raise NotFound(f"no image with id {image_id} in this index")
        return r

    def page(self, offset: int, limit: int) -> list[ImageRow]:
        return self.store.page(offset, limit)

    def file(self, image_id: int) -> Path:
        """The indexed file of `image_id`, only ever inside the indexed folder."""
        path = (self.root / self.row(image_id).path).resolve()
        if not path.is_relative_to(self.root.resolve()) or not path.is_file():
            raise NotFound(f"image {image_id} is no longer on disk; run `foco index update`")
        return path

    def available_methods(self) -> list[str]:
        """Methods this server can run: the training-free ones, and those whose weights were given."""
        names = ["slerp", "sum", "image", "text"]
        if self.options.checkpoint is not None:
            names.insert(0, "foco")
        if self.options.foco_edits is not None:
            names.insert(1 if self.options.checkpoint is not None else 0, "foco-edits")
        if self.options.pic2word is not None:
            names.append("pic2word")
        return names

    # --- queries ---------------------------------------------------------------------------------------------
    def _method(self, name: str):
        if name not in self.available_methods():
            raise QueryError(f"method {name!r} is not available here; choose from {self.available_methods()}"
                             + (" (foco needs --checkpoint)" if name in ("foco", "foco-edits") else ""))
        if name not in self._methods:
            self._methods[name] = build_method(name, opts=self.options)
        return self._methods[name]

    def _check(self, q: Query) -> None:
        if not isinstance(q.text, str) or not q.text.strip():
            raise QueryError("text is empty: give the modification, e.g. 'make the dress red'")
        if len(q.text) > self.limits.max_text_chars:
            raise QueryError(f"text has {len(q.text)} characters; at most {self.limits.max_text_chars}")
        if not 1 <= q.k <= self.limits.max_k:
            raise QueryError(f"k must be between 1 and {self.limits.max_k}, got {q.k}")
        if q.chord < 0:
            raise QueryError(f"chord lambda must be >= 0, got {q.chord}")
        if q.reference is None:
            raise QueryError("a reference image is required: an indexed id or an uploaded image")

    def _reference(self, ref: int | Image.Image, need_patches: bool) -> tuple[ImageFeatures, tuple[int, int]]:
        """(1, D) global and (1, P, D) patches of the reference, and its pixel size."""
        if isinstance(ref, Image.Image):
            f = self._encode_image(ref)
            return f, ref.size
        row = self.row(int(ref))
        g = torch.from_numpy(self.store.vector_rows([row.id])).view(1, self.dim)
        if not need_patches:
            return ImageFeatures(g, torch.empty(1, 0, self.dim)), (row.width, row.height)
        stored = self.store.patch_rows(row.id)
        if stored is not None:
            return ImageFeatures(g, torch.from_numpy(stored)[None]), (row.width, row.height)
        f = self._encode_image(open_image(self.file(row.id)))
        return ImageFeatures(g, f.patches), (row.width, row.height)

    def _encode_image(self, image: Image.Image) -> ImageFeatures:
        with torch.inference_mode(), autocast(self.meta.get("precision", "fp32")):
            f = self.backbone.encode_images([image.convert("RGB")])
        return ImageFeatures(f.global_.float(), f.patches.float())

    def encode_text(self, text: str) -> TextFeatures:
        with torch.inference_mode(), autocast(self.meta.get("precision", "fp32")):
            f = self.backbone.encode_texts([text])
        return TextFeatures(f.global_.float(), f.tokens.float(), f.mask)

    def search(self, q: Query) -> Answer:
        self._check(q)
        method = self._method(q.method)
        with self._lock:
            reads_patches = METHODS.get(q.method).reads_anchor  # FoCo's family reads patches and the box
            ref, size = self._reference(q.reference, need_patches=reads_patches)
            bias = None
            if q.box is not None:
                if not reads_patches:
                    raise QueryError(f"a box steers FoCo's attention; method {q.method!r} has none")
                bias = self._box_bias(q.box, size, ref.patches.shape[1])
            batch = QueryBatch(reference=ref, modification=self.encode_text(q.text), texts=[q.text], attn_bias=bias)
            with torch.inference_mode():
                composed = method.encode(batch)
            query = composed.query.float()  # (1, D)
            exclude = int(q.reference) if not isinstance(q.reference, Image.Image) and not q.keep_reference else None
            hits = self._rank(query, ref.global_, q.k, q.chord, exclude)
        attention = composed.attention[0] if composed.attention is not None else None
        return Answer(hits, attention, size)

    def search_vector(self, vector: np.ndarray, k: int) -> list[Hit]:
        """Nearest images to a (D,) vector (clip-retrieval's embedding_input)."""
        if vector.shape != (self.dim,):
            raise QueryError(f"the embedding has {vector.shape[0] if vector.ndim == 1 else vector.shape} values; "
                             f"this index holds {self.dim}-dimensional vectors")
        if not 1 <= k <= self.limits.max_k:
            raise QueryError(f"k must be between 1 and {self.limits.max_k}, got {k}")
        q = torch.nn.functional.normalize(torch.from_numpy(vector.astype(np.float32))[None], dim=-1)
        with self._lock:
            return self._rank(q, None, k, 0.0, None)

    def _box_bias(self, box, size: tuple[int, int], num_patches: int) -> torch.Tensor:
        x0, y0, x1, y1 = (float(v) for v in box)
        W, H = size
        if not (0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H):
            raise QueryError(f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) is not inside the {W} x {H} reference "
                             "(x0 < x1, y0 < y1, in pixels)")
        return box_attention_bias(torch.tensor([[x0, y0, x1, y1]]), self.box_beta, (W, H), patch_grid(num_patches))

    def _rank(self, query: torch.Tensor, reference: torch.Tensor | None, k: int, chord: float,
              exclude: int | None) -> list[Hit]:
        depth = k + (exclude is not None)
        depth = max(depth, CHORD_SHORTLIST) if chord > 0 else depth
        depth = max(depth * self.refine, depth) if self.refine else depth  # a PQ shortlist, re-ranked exactly
        scores, ids = search_vectors(self.index, query.numpy(), depth)
        scores, ids = scores[0], ids[0]
        keep = (ids >= 0) & (ids != (exclude if exclude is not None else -2))
        scores, ids = scores[keep], ids[keep]
        if (self.refine or chord > 0) and len(ids):
            vecs = torch.from_numpy(self.store.vector_rows(ids))  # (n, D) the stored vectors, exact values
            if chord > 0 and reference is not None:
                from ..eval.chord import chord_scores_candidates
                s = chord_scores_candidates(query, vecs[None], reference, chord)[0].numpy()
            else:
                s = (vecs @ query[0].float()).numpy()
            order = np.argsort(-s, kind="stable")
            scores, ids = s[order], ids[order]
        out = []
        for s, i in zip(scores[:k].tolist(), ids[:k].tolist()):
            r = self.store.row(int(i))
            out.append(Hit(int(i), r.path if r else "?", float(s)))
        return out
