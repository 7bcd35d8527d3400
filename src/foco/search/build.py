"""`foco index build | update`: index a folder of images for composed search.

    INDEX/index.json      backbone spec, images folder (resolved), dimension, precision, and the vector index's
                          record (factory string, what it was trained on, on-disk lists, the last id it holds)
    INDEX/images.sqlite   one row per indexed file: id, relative path, size, mtime, sha256, pixel size, slot
    INDEX/vectors/        the global features, float32 arrays by slot (`arrays.py`); INDEX/patches/ likewise
                          (float16) with --with-patches
    INDEX/vectors.faiss   the FAISS index of the global features under the rows' ids (`vectors.py`), and
                          INDEX/trained.faiss, the same index trained but empty (updates add through it);
                          INDEX/lists-*.ivfdata with --ondisk
    INDEX/skipped.tsv     files that could not be indexed, and why (rewritten by every build and update)

The folder is walked recursively for .jpg .jpeg .png .webp .bmp (any case). Each image is decoded with EXIF
orientation applied, converted to RGB and encoded by the backbone. An unreadable or oversized file (Pillow's
decompression-bomb limit) is skipped, counted and listed, never fatal. Files outside the folder (through links)
are not indexed.

The input pipeline is training's and extraction's (`foco.corpora.loader`, issue 43): DataLoader workers
(`IndexConfig.workers`, `--workers`) open each file (`open_image`'s checks), hash it, and preprocess it with the
backbone's `image_transform()`; they hand back uint8 pixels (pinned on CUDA), the image's size and its sha256, or
the reason it cannot be read (`Opened`). This process only encodes (`encode_pixels`). A backbone without that
path (`foco.backbones.base.has_pixel_path`) is given the decoded images, read in this process.

Incremental: a file whose size and mtime match its row is kept as is; one whose size or mtime changed is hashed,
and re-encoded only when its sha256 changed; files that disappeared are dropped; new files are encoded. Each batch
is committed as it finishes, so a killed build resumes where it stopped. The vector index then takes in what
changed without retraining (`vectors.update_faiss`); it is trained again only on the first build, with
--retrain, or when --index-type names another index. Memory stays bounded: features go to disk batch by batch,
and the FAISS index is trained on a sample and filled a chunk at a time from the arrays.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from dataclasses import replace, asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from ..backbones import canonical_spec, create_backbone
from ..backbones.base import has_pixel_path
from ..corpora.loader import make_loader
from ..utils.io import atomic_write_text, file_stamp, sha256_file, stamp_problem
from ..utils.text import is_unicode
from ..utils.precision import autocast, resolve_precision
from ..utils.progress import Bar
from .store import ImageRow, ImageStore
from .vectors import VectorConfig, build_faiss, resolve_refine, update_faiss

log = logging.getLogger(__name__)
EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
MAX_IMAGE_PIXELS = 64_000_000  # larger images are skipped as possible decompression bombs
FORMAT_VERSION = 2  # 1: vectors inside SQLite (refused, with the fix)


@dataclass
class IndexConfig:
    images: str  # the folder to index (stored resolved)
    backbone: str  # backbone spec
    index_type: str = "Flat"  # FAISS index-factory string, or "auto" (within max_index_memory)
    with_patches: bool = False  # store patch features too (otherwise computed at query time)
    precision: str = "fp32"
    batch_size: int = 64
    train_size: int | None = None  # vectors to train the index on (None: FAISS's guidance, `default_train_size`)
    max_index_memory: str = "4GB"  # the budget of --index-type auto
    ondisk: bool = False  # IVF: inverted lists on disk, memory-mapped
    retrain: bool = False  # train the vector index again instead of adding to it
    reencode: bool = False  # encode every image again: the backbone's weights changed since the index was built
    refine: int | None = None  # PQ indexes: the exact re-rank's shortlist factor (None: vectors.REFINE_PQ)
    workers: int = 0  # DataLoader workers opening, hashing and preprocessing the files (0: in this process;
                     # the CLI's --workers defaults to 2)


@dataclass
class IndexStats:
    indexed: int  # rows after the job
    encoded: int  # files encoded now
    unchanged: int
    touched: int  # mtime changed, content did not
    removed: int
    skipped: int
    seconds: float
    images_per_s: float
    growth: str | None = None  # the collection has outgrown the trained vector index (`vectors.growth`)
    unreadable_removed: int = 0  # of `removed`: indexed files that changed and can no longer be read


def open_image(path: Path) -> Image.Image:
    """Decodes an image the way the index does: EXIF orientation applied, RGB; raises ValueError with the reason."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        old = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
        try:
            with Image.open(path) as im:
                im = ImageOps.exif_transpose(im)
                return im.convert("RGB")
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ValueError(f"too many pixels ({exc})") from None
        except (OSError, SyntaxError, ValueError) as exc:  # truncated, not an image, unknown format
            raise ValueError(f"unreadable image ({type(exc).__name__}: {exc})") from None
        finally:
            Image.MAX_IMAGE_PIXELS = old


def walk_images(root: Path) -> list[Path]:
    """Image files under `root`, recursively, sorted; links leading outside `root` are left out."""
    real_root = root.resolve()
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.suffix.lower() in EXTENSIONS and p.resolve().is_relative_to(real_root) and p.is_file():
                found.append(p)
    return found


def read_meta(out: Path) -> dict:
    """An index's index.json: of this format (an older one is refused with the fix), checked against its schema
    (`foco.records`)."""
    from ..records import FIXES, check
    from ..utils.io import ManifestError, read_json
    try:
        meta = read_json(out / "index.json")
    except ManifestError as exc:
        raise ManifestError(f"{exc}; {FIXES['index.json']}") from None
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise ValueError(f"{out / 'index.json'}: format_version {version} was written by a newer foco (this one reads "
                         f"{FORMAT_VERSION}); update foco, or build the index again into a new --out")
    if isinstance(version, int) and not isinstance(version, bool) and version < FORMAT_VERSION:
        raise ValueError(f"{out} was written by an older foco (index format {meta.get('format_version')}, vectors "
                         "inside SQLite); build it again with `foco index build` into a new --out")
    return check("index.json", meta, out / "index.json")


def _check_config(out: Path, cfg: IndexConfig) -> dict:
    meta_path = out / "index.json"
    want = {"format_version": FORMAT_VERSION, "images": str(Path(cfg.images).resolve()),
            "backbone": canonical_spec(cfg.backbone), "index_type": cfg.index_type, "with_patches": cfg.with_patches,
            "precision": resolve_precision(cfg.precision), "train_size": cfg.train_size,
            "max_index_memory": cfg.max_index_memory}
    if meta_path.is_file():
        have = read_meta(out)
        diff = [f"{k} {have.get(k)!r} (now {v!r})" for k, v in want.items()
                if k not in ("index_type", "train_size", "max_index_memory", "backbone") and have.get(k) != v]
        if canonical_spec(have.get("backbone", "")) != want["backbone"]:
            diff.append(f"backbone {have.get('backbone')!r} (now {want['backbone']!r})")
        if diff:
            raise ValueError(f"{out} indexes with " + ", ".join(diff) + "; use `foco index update` with the same "
                             "settings, or choose another --out")
    return want


def build_index(cfg: IndexConfig, out: str | Path, backbone=None, precomputed: dict[str, np.ndarray] | None = None,
                device: str = "cpu") -> IndexStats:
    """Builds or brings up to date the index in `out` (see the module docstring). `precomputed` maps a resolved
    file path to its (D,) global feature from an earlier extraction with the same backbone, to skip encoding it."""
    device = str(getattr(backbone, "device", device))  # "auto" precision: bf16 where this device computes it
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device))
    out = Path(out)
    root = Path(cfg.images)
    if not root.is_dir():
        raise FileNotFoundError(f"--images {root} is not a folder")
    meta = _check_config(out, cfg)
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        return _build(cfg, out, meta, backbone, precomputed, device, root)


@contextlib.contextmanager
def _exclusive(out: Path):
    """One writer per index: a second build or update of the same folder is refused while this one runs."""
    import fcntl
    fd = os.open(out / ".lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{out} is being built or updated by another job; wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def _build(cfg: IndexConfig, out: Path, meta: dict, backbone, precomputed, device: str, root: Path) -> IndexStats:
    previous_meta = read_meta(out) if (out / "index.json").is_file() else None
    backbone, cfg, sha = _same_weights(cfg, out, previous_meta, backbone, device)
    previous = (previous_meta or {}).get("vectors")
    atomic_write_text(out / "index.json", json.dumps({**meta, "building": True, "vectors": previous,
                                                      "backbone_sha256": sha}, indent=2) + "\n")
    t0 = time.time()
    files = walk_images(root)
    skipped: list[tuple[str, str]] = []
    dropped: list[str] = []  # indexed files that changed and became unreadable: removed
    encoded = unchanged = touched = 0
    with ImageStore(out / "images.sqlite") as store:
        have = store.rows()
        on_disk = {p.relative_to(root).as_posix(): p for p in files}
        for rel in [r for r in on_disk if not is_unicode(r)]:  # listed as skipped, never a stuck build
            del on_disk[rel]
            skipped.append((os.fsencode(rel).decode("utf-8", "backslashreplace"),
                            "its name is not valid UTF-8, in which the index stores names: rename the file"))
        gone = sorted(set(have) - set(on_disk))
        if gone:
            store.remove(gone)
        todo: list[tuple[str, Path, os.stat_result, str | None]] = []
        for rel, p in on_disk.items():
            st = p.stat()
            row = have.get(rel)
            if row is not None and row.size == st.st_size and row.mtime_ns == st.st_mtime_ns:
                unchanged += 1
                continue
            digest = None
            if row is not None:
                digest = sha256_file(p)
                if digest == row.sha256:
                    store.touch(rel, st.st_size, st.st_mtime_ns)
                    touched += 1
                    continue
            todo.append((rel, p, st, digest))
        if todo:
            backbone = backbone or create_backbone(cfg.backbone, device=device)
            bar = Bar(len(todo), "indexing images")
            for n, (images, opened) in enumerate(_opened_batches(backbone, todo, cfg)):  # workers open the files
                batch, rows = todo[n * cfg.batch_size:(n + 1) * cfg.batch_size], []
                for (rel, _, st, _), (size, digest, error) in zip(batch, opened, strict=True):
                    if error is not None:
                        if rel in have:  # it changed and cannot be read: its old vector named other bytes
                            store.remove([rel])
                            dropped.append(rel)
                            error = f"{error}; its earlier version was removed from the index"
                        skipped.append((rel, error))
                        continue
                    rows.append(ImageRow(0, rel, st.st_size, st.st_mtime_ns, digest, *size))
                vecs, patches = _encode(backbone, images, rows, root, cfg, precomputed)
                store.add(rows, vecs, patches)
                encoded += len(rows)
                bar.update(len(batch))
            bar.close()
        vec = _vector_index(store, out, cfg, previous, gpu=device.startswith("cuda"))
        indexed = store.count()
        dim = store.dim()
    atomic_write_text(out / "skipped.tsv", "path\treason\n" + "".join(f"{r}\t{why}\n" for r, why in skipped))
    seconds = time.time() - t0
    stats = IndexStats(indexed, encoded, unchanged, touched, len(gone) + len(dropped), len(skipped), round(seconds, 2),
                       round(encoded / seconds, 1) if encoded and seconds else 0.0, vec.get("growth"), len(dropped))
    atomic_write_text(out / "index.json", json.dumps({**meta, "dim": dim, "count": indexed, "vectors": vec,
                                                      "backbone_sha256": sha, "files": _stamps(out, previous_meta),
                                                      "last_run": asdict(stats)}, indent=2) + "\n")
    return stats


def _same_weights(cfg: IndexConfig, out: Path, previous_meta: dict | None, backbone, device: str):
    """(backbone, cfg, the weights' sha256 the index's vectors are of). Vectors already stored (a finished build,
    or an interrupted one: its marker records the weights too) must come from the backbone's weights now: other
    weights, or no record of them, are refused unless `cfg.reencode`, which drops every vector to encode them all
    again (and retrains the vector index)."""
    backbone = backbone or create_backbone(cfg.backbone, device=device)
    now = getattr(backbone, "weights_sha256", None)
    stored = 0
    if (out / "images.sqlite").is_file():
        with ImageStore(out / "images.sqlite") as store:
            stored = store.count()
    recorded = (previous_meta or {}).get("backbone_sha256")
    if not stored or (not cfg.reencode and recorded and (now is None or now == recorded)):
        return backbone, cfg, recorded or now
    if not cfg.reencode:
        if not recorded:
            raise ValueError(f"{out / 'index.json'} records no backbone_sha256, so the weights its {stored} vectors "
                             "were encoded with cannot be checked against the backbone's now; encode every image "
                             f"again with `foco index update {out} --reencode`, or build a new index")
        raise ValueError(f"{out / 'index.json'}: its {stored} vectors were encoded with other weights of "
                         f"{cfg.backbone} (sha256 {str(recorded)[:12]}...) than the ones there now ({now[:12]}...), "
                         "and new vectors would not be comparable with them; restore the weights, or encode every "
                         f"image again with `foco index update {out} --reencode`")
    with ImageStore(out / "images.sqlite") as store:  # every vector goes: they are all encoded again
        store.remove(sorted(store.rows()))
    return backbone, replace(cfg, retrain=True), now


def _stamps(out: Path, previous_meta: dict | None) -> dict:
    """The content stamps of the index's data files (the vector index, the feature arrays), by path relative to
    `out`: a reader refuses any that changed since (`check_files`). A file whose size and mtime are those of the
    previous run's stamp keeps it unhashed: an update hashes the vector index and the last array shard, not the
    arrays of every image."""
    before = (previous_meta or {}).get("files") or {}
    files = [out / "vectors.faiss", *sorted((out / "vectors").glob("shard-*")),
             *sorted((out / "patches").glob("shard-*"))]
    stamps = {}
    for p in files:
        rel = p.relative_to(out).as_posix()
        if p.is_file():
            st, old = p.stat(), before.get(rel) or {}
            same = old.get("bytes") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
            stamps[rel] = old if same else file_stamp(p)
    return stamps


def check_files(out: Path, meta: dict) -> None:
    """Refuses an index whose data files are not those index.json vouches for (a flipped byte, a truncated or
    swapped file); an index from before the stamps were recorded is read as it is."""
    for rel, stamp in (meta.get("files") or {}).items():
        problem = stamp_problem(out / rel, stamp)
        if problem:
            raise ValueError(f"{problem}: the index is damaged; rebuild it into a new --out (`foco index build`), or "
                             f"restore {out} from a copy")


def _vector_index(store: ImageStore, out: Path, cfg: IndexConfig, have: dict | None, gpu: bool = False) -> dict:
    """Trains and fills the vector index, or brings it up to date without retraining; `gpu`: on the GPUs FAISS
    sees, if any (`vectors.use_gpu`)."""
    vcfg = VectorConfig(cfg.index_type, cfg.max_index_memory, cfg.train_size, cfg.ondisk, cfg.refine, gpu=gpu)
    fresh = (have is None or cfg.retrain or not (out / "vectors.faiss").is_file()
             or not (out / "trained.faiss").is_file()
             or (cfg.index_type not in ("auto", have["factory"])) or bool(cfg.ondisk) != bool(have.get("ondisk")))
    if store.dim() is None:
        return {"factory": None, "count": 0, "max_id": 0}
    if fresh or have.get("factory") is None:
        return build_faiss(store, out, vcfg)
    rec = update_faiss(store, out, have, gpu=gpu)
    if cfg.refine is not None:  # a search-time setting: recorded, nothing to rebuild
        rec.update(refine=resolve_refine(rec["factory"], cfg.refine), refine_asked=cfg.refine)
    return rec


class Opened(torch.utils.data.Dataset):
    """File i of a build's to-do list, opened where the DataLoader runs it (a worker): `(pixels, (width, height),
    sha256, None)`, or `(None, None, None, reason)` for a file `open_image` refuses (the reason is its message), so
    that an unreadable file is skipped and listed, never an exception that stops the build. `pixels` is
    `transform(image)`, (3, H, W) uint8 (`PixelBackbone.image_transform()`), or the decoded image itself where
    `transform` is None; the sha256 is computed only where `digests[i]` (known from the scan) is None."""

    def __init__(self, paths: list[Path], digests: list[str | None], transform=None):
        self.paths, self.digests, self.transform = paths, digests, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            im = open_image(self.paths[i])
        except ValueError as exc:
            return None, None, None, str(exc)
        pixels = im if self.transform is None else self.transform(im)
        return pixels, im.size, self.digests[i] or sha256_file(self.paths[i]), None


def collate_opened(items: list[tuple]) -> tuple:
    """A batch of `Opened` items -> (the readable ones' pixels stacked, (b, 3, H, W); or their images, a list; None
    when none is readable), [(size, sha256, reason) of each item, in order])."""
    ok = [it[0] for it in items if it[3] is None]
    images = (torch.stack(ok) if isinstance(ok[0], torch.Tensor) else ok) if ok else None
    return images, [tuple(it[1:]) for it in items]


def _opened_batches(backbone, todo: list[tuple], cfg: IndexConfig):
    """`collate_opened` batches of the files of `todo`, `cfg.batch_size` at a time and in order: opened, hashed
    and preprocessed by `cfg.workers` DataLoader workers (pinned on CUDA), a few batches ahead; a backbone without
    the pixel path is given decoded images, read here as before."""
    pixel_path = has_pixel_path(backbone)
    dataset = Opened([p for _, p, _, _ in todo], [d for *_, d in todo],
                     backbone.image_transform() if pixel_path else None)
    workers = min(cfg.workers, -(-len(todo) // cfg.batch_size)) if pixel_path else 0  # none idle
    yield from make_loader(dataset, device=getattr(backbone, "device", "cpu"), workers=workers,
                           batch_size=cfg.batch_size, collate_fn=collate_opened)


def _encode(backbone, images: torch.Tensor | list[Image.Image] | None, rows: list[ImageRow], root: Path,
            cfg: IndexConfig, precomputed: dict[str, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(B, D) global features (and (B, P, D) patches with --with-patches) of the batch's readable images: their
    (B, 3, H, W) pixels (`encode_pixels`), or their decoded images for a backbone without that path."""
    if not rows:
        return np.zeros((0, backbone.embed_dim), np.float32), None
    if precomputed is not None and not cfg.with_patches:
        keys = [str((root / r.path).resolve()) for r in rows]
        if all(k in precomputed for k in keys):
            return np.stack([precomputed[k] for k in keys]).astype(np.float32), None
    with autocast(cfg.precision, str(getattr(backbone, "device", "cpu"))):
        f = backbone.encode_pixels(images) if isinstance(images, torch.Tensor) else backbone.encode_images(images)
    vecs = f.global_.float().numpy()
    return vecs, (f.patches.float().numpy() if cfg.with_patches else None)


def update_index(out: str | Path, backbone=None, device: str = "cpu", retrain: bool = False,
                 reencode: bool = False, workers: int = 0) -> IndexStats:
    """`foco index update INDEX`: the same job with the settings recorded in INDEX/index.json; the vector index
    takes in what changed, and is trained again only with `retrain`. Weights of the backbone that changed since
    the index was built are refused, unless `reencode`: then every image is encoded again. `workers`: the
    DataLoader workers that open the files (`IndexConfig.workers`)."""
    out = Path(out)
    if not (out / "index.json").is_file():
        raise FileNotFoundError(f"{out} is not an index (no index.json); make one with `foco index build`")
    meta = read_meta(out)
    if meta.get("source") == "shards":
        raise ValueError(f"{out} was built from webdataset shards ({meta['images']}); bring it up to date by "
                         f"rerunning `foco index build --in '{meta['images']}' --out {out}` with its settings")
    vec = meta.get("vectors") or {}
    cfg = IndexConfig(images=meta["images"], backbone=meta["backbone"], index_type=meta["index_type"],
                      with_patches=meta["with_patches"], precision=meta["precision"],
                      train_size=meta.get("train_size"), max_index_memory=meta.get("max_index_memory", "4GB"),
                      ondisk=bool(vec.get("ondisk")), retrain=retrain, refine=vec.get("refine_asked"),
                      reencode=reencode, workers=workers)
    return build_index(cfg, out, backbone, device=device)
