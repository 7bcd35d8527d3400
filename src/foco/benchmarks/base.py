"""The common form of a composed-image-retrieval benchmark, whatever its official files look like.

Each reader (`fashioniq`, `cirr`, `circo`, `genecis`, `world`) turns a dataset root into one or more
`CIRBenchmark` parts (FashionIQ: one per category; GeneCIS: one per task). Caching, ranking, metrics and
submission files see only this form, so benchmarks differ in data and ground truth, never in evaluation code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..utils.io import ImageLoadError

if TYPE_CHECKING:
    from PIL import Image

GENECIS_DILATION = 0.7  # GeneCIS widens each instance box by this fraction of its width/height


@dataclass(frozen=True)
class ImageRef:
    """Where an image is read from: a file, optionally cropped to an instance box (GeneCIS attribute tasks)."""

    path: Path
    box: tuple[float, float, float, float] | None = None  # [x, y, w, h] in pixels of the full image

    def load(self) -> "Image.Image":
        from ..utils.io import load_image
        image = load_image(self.path)
        return image if self.box is None else dilated_square_crop(image, self.box, GENECIS_DILATION)

    def __str__(self) -> str:  # also the cache key: a crop of a file is another item than the file
        return str(self.path) if self.box is None else f"{self.path}#box={','.join(f'{v:g}' for v in self.box)}"


def dilated_square_crop(image: "Image.Image", box: tuple[float, float, float, float],
                        dilation: float) -> "Image.Image":
    """GeneCIS's crop: the box [x, y, w, h] grown by `dilation` (left/top move out by dilation * w/h, the width
    becomes (1 + dilation) * w), clipped to the image, then padded to a centred square with black."""
    from PIL import Image as PILImage
    x, y, w, h = box
    W, H = image.size
    left, top = max(0.0, x - dilation * w), max(0.0, y - dilation * h)
    right, bottom = min(W, left + (1 + dilation) * w), min(H, top + (1 + dilation) * h)
    crop = image.crop((left, top, right, bottom))  # PIL rounds the float box to pixels
    cw, ch = crop.size
    if cw == ch:
        return crop
    side = max(cw, ch)
    square = PILImage.new(crop.mode, (side, side), (0, 0, 0))
    square.paste(crop, ((side - cw) // 2, (side - ch) // 2))
    return square


@dataclass(frozen=True)
class EvalProtocol:
    """What a benchmark's official evaluation does with a ranking."""

    remove_reference: bool  # drop each query's reference image from its full-gallery ranking (CIRR) or keep it
    recall_ks: tuple[int, ...] = ()  # R@K: over the shared gallery, or over the query's own gallery (GeneCIS)
    subset_ks: tuple[int, ...] = ()  # CIRR's Recall_subset@K over the subset members minus the reference
    map_ks: tuple[int, ...] = ()  # CIRCO's mAP@K
    instance_ks: tuple[int, ...] = ()  # OACIR's R_ID@K: a top-K image shows the query's anchored instance
    average: tuple[str, ...] = ()  # metrics averaged into "Avg" (OACIRR's tables: R_ID@1, R@1, R@5)
    submission: str | None = None  # "cirr" or "circo": the test server's file format for rankings
    parts_averaged: bool = True  # the parts are categories or tasks of one table, averaged (FashionIQ, GeneCIS);
                                 # False: each part is a protocol of its own, reported side by side (the world's)


@dataclass
class CIRQuery:
    id: str
    reference: str  # image id
    texts: tuple[str, ...]  # text variants; their composed queries are averaged (FashionIQ's "both" join)
    targets: list[str]  # ground-truth image ids; empty on test splits
    subset: list[str] = field(default_factory=list)  # CIRR img_set members, the reference included
    gallery: list[str] | None = None  # GeneCIS: the query's own gallery, [target] + distractors
    category: str | None = None  # FashionIQ category, GeneCIS task, world edit type
    instance: str | None = None  # OACIR: the identity of the anchored instance (R_ID@K)
    box: tuple[float, float, float, float] | None = None  # OACIR: x0, y0, x1, y1 in pixels of the reference
    box_size: tuple[int, int] | None = None  # the reference's W, H in pixels, the frame of `box`


@dataclass
class CIRBenchmark:
    name: str  # "cirr", "circo", "fashioniq/dress", "genecis/change_object", "world/single", ...
    split: str
    images: dict[str, ImageRef]  # every image id used (gallery, references, per-query galleries) -> file
    gallery: list[str]  # the shared gallery, in file order; empty when each query has its own
    queries: list[CIRQuery]
    protocol: EvalProtocol
    discarded: int = 0  # annotation entries the official evaluation leaves out (GeneCIS: non-modal galleries)
    options: dict[str, Any] = field(default_factory=dict)  # reader options in force, reported with results
    source: dict[str, Any] = field(default_factory=dict)  # what it was read from (the world's fingerprint); checked
    instances: dict[str, tuple[str, ...]] = field(default_factory=dict)  # OACIR: gallery id -> instances it shows

    @property
    def has_targets(self) -> bool:
        return all(q.targets for q in self.queries)

    def reference_ids(self) -> list[str]:
        return list(dict.fromkeys(q.reference for q in self.queries))

    def gallery_ids(self) -> list[str]:
        """The images to index: the shared gallery, or the union of the per-query galleries."""
        if self.gallery:
            return list(self.gallery)
        return list(dict.fromkeys(g for q in self.queries for g in (q.gallery or [])))

    def texts(self) -> list[str]:
        return list(dict.fromkeys(t for q in self.queries for t in q.texts))


@dataclass(frozen=True)
class ReaderOption:
    """An option of one reader, declared beside it so that the command line offers it without knowing the
    benchmark: `--FLAG VALUE` becomes the reader's keyword argument `name` = parse(VALUE)."""

    name: str  # the reader's keyword argument
    flag: str  # the command-line flag
    help: str
    default: str | None = None  # as typed on the command line (parsed like any value)
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] = str


@dataclass(frozen=True)
class BenchmarkReader:
    """What the benchmark registry holds: `read(root, split, **options) -> list[CIRBenchmark]` and its options."""

    read: Callable[..., list[CIRBenchmark]]
    options: tuple[ReaderOption, ...] = ()


def check_images(parts: list[CIRBenchmark]) -> None:
    """Every gallery and reference file of every part exists; otherwise one ImageLoadError says how many are
    missing in which folder, e.g. "37 gallery image(s) missing under ROOT/dev, e.g. ..."."""
    missing: dict[tuple[str, Path], dict[Path, None]] = {}  # (role, folder) -> missing files, in order
    for bench in parts:
        for role, ids in (("gallery", bench.gallery_ids()), ("reference", bench.reference_ids())):
            for i in ids:
                path = bench.images[i].path
                if not path.is_file():
                    missing.setdefault((role, path.parent), {})[path] = None
    if missing:
        raise ImageLoadError("; ".join(
            f"{len(paths)} {role} image(s) missing under {folder}, e.g. {', '.join(p.name for p in list(paths)[:3])}"
            for (role, folder), paths in missing.items()))


def resolve_image(folder: Path, stem: str, exts: tuple[str, ...] = (".jpg", ".png")) -> Path:
    """`folder/stem.ext` for the first extension that exists (the first one when none does)."""
    for ext in exts:
        p = folder / f"{stem}{ext}"
        if p.is_file():
            return p
    return folder / f"{stem}{exts[0]}"
