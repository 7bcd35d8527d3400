"""`foco index build --in 'shards/{00000..99999}.tar'`: an index of webdataset shards (img2dataset's layout),
encoded by many ranks under torchrun, then trained and filled by one process in bounded memory.

    OUT/features/             the per-shard feature caches (`foco.corpus_features.extract_corpus`: corpus.json,
                              parts/<shard>/), unless --features names a corpus `foco features extract --in` wrote
    OUT/samples/<shard>.json  each shard's samples in order: key, the image member's offset and size in the tar, its
                              sha256 and pixel size, url and caption (the sample's .json / .txt); written whole by
                              the rank that encodes the shard (a finished shard is never read again)
    OUT/index.json, images.sqlite, vectors/, vectors.faiss, trained.faiss
                              the index as `foco index build --images` writes it (`build.py`), each image's row
                              named `<shard>.tar#<key>`; the `samples` table keeps its tar offset, url and caption

Step 1, on every rank (`encode_shards`): rank r of N encodes shards r, r + N, r + 2N, ... (extraction's split), a
shard at a time, each finished shard kept (a killed run resumes at the first unfinished one), then reads its
shards' sample lists. With --features nothing is encoded: the corpus must hold every shard, of --backbone.
Step 2, on rank 0 once every rank is done (`fill_index`): the shards' global features go into the index's arrays
and images.sqlite in shard order, a batch of FILL_ROWS at a time, each batch one transaction of batched inserts
(a killed fill resumes at the first row not committed), so ids are the same however many ranks encoded; then the
FAISS index is trained on a sample drawn across every shard and filled a chunk at a time (`vectors.build_faiss`,
on the GPUs FAISS sees when the device is CUDA). Nothing corpus-sized is ever in memory.

A shard's images are never re-encoded at search time from a folder: they lie inside the tars, so the engine reads
an indexed reference back from its tar (`open_sample`) and never checks a file's mtime (a sample does not change).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from ..backbones import canonical_spec, create_backbone
from ..corpora.webdataset import IMAGE_EXTS, expand_pattern, sample_text, shard_paths, tar_files
from ..utils.io import atomic_write_text, read_json
from ..utils.progress import Bar
from .build import FORMAT_VERSION, IndexConfig, IndexStats, _exclusive, _stamps, _vector_index, read_meta
from .store import ImageRow, ImageStore

FILL_ROWS = 1 << 14  # rows per fill transaction: 48 MB of 768-d float32 vectors


@dataclass
class ShardIndexConfig:
    shards: str | None  # the webdataset pattern, e.g. 'shards/{00000..00099}.tar' (None: --features' own)
    backbone: str  # backbone spec
    features: str | None = None  # a corpus `foco features extract --in` wrote (None: encoded into OUT/features)
    index_type: str = "Flat"  # FAISS index-factory string, or "auto"
    precision: str = "fp32"  # encoding precision
    batch_size: int = 64  # images per encoder call
    train_size: int | None = None
    max_index_memory: str = "4GB"
    ondisk: bool = False
    refine: int | None = None
    workers: int = 2  # DataLoader workers decoding a shard's images
    dtype: str = "float16"  # the per-shard caches' storage dtype (the index's arrays are float32, re-normalised)


def _corpus(cfg: ShardIndexConfig, out: Path) -> tuple[str, Path, dict | None]:
    """(the shard pattern, the features corpus folder, its corpus.json or None before extraction); a corpus of
    another backbone is refused."""
    from ..records import read as read_record
    features = Path(cfg.features) if cfg.features else out / "features"
    record = None
    if cfg.features and not (features / "corpus.json").is_file():
        raise FileNotFoundError(f"--features {features}: no corpus.json; give the --out of `foco features extract "
                                "--in ...`, or leave --features out to encode the shards")
    if (features / "corpus.json").is_file():
        record = read_record("corpus.json", features / "corpus.json")
        if canonical_spec(record["backbone"]) != canonical_spec(cfg.backbone):
            flag = f"--features {features}" if cfg.features else f"--out {out}"
            raise ValueError(f"{features / 'corpus.json'}: its features were extracted with backbone "
                             f"{record['backbone']!r}, not --backbone {cfg.backbone!r}, and vectors of two backbones "
                             f"are not comparable; give --backbone {record['backbone']}, or another {flag}")
    pattern = cfg.shards or (record or {}).get("pattern")
    if not pattern:
        raise ValueError("give the shards (--in 'shards/{00000..00099}.tar'); the --features corpus records none")
    return pattern, features, record


def _names(pattern: str) -> list[str]:
    names = [Path(p).stem for p in expand_pattern(pattern)]
    if len(set(names)) != len(names):
        raise ValueError(f"--in {pattern}: two shards share a name; name every shard of a pattern differently")
    return names


def encode_shards(cfg: ShardIndexConfig, out: str | Path, backbone=None, device: str = "cpu", rank: int = 0,
                  world_size: int = 1) -> dict:
    """Step 1 on rank `rank` of `world_size` (module docstring): its shards' features (unless --features) and
    sample lists; returns {"shards", "mine", "encoded", "read"}."""
    out = Path(out)
    pattern, features, _ = _corpus(cfg, out)
    shards = shard_paths(pattern)
    _names(pattern)
    encoded = 0
    if cfg.features is None:
        from ..corpus_features import extract_corpus
        from ..features import ExtractConfig
        backbone = backbone or create_backbone(cfg.backbone, device=device)
        ecfg = ExtractConfig(batch_size=cfg.batch_size, dtype=cfg.dtype, patches=False, precision=cfg.precision)
        encoded = extract_corpus(backbone, pattern, features, ecfg, decompositions=None, workers=cfg.workers,
                                 rank=rank, world_size=world_size)["done_now"]
    mine = [s for n, s in enumerate(shards) if n % world_size == rank]
    read = 0
    bar = Bar(len(mine), f"rank {rank}: reading the shards' samples")
    for shard in mine:
        path = out / "samples" / f"{shard.stem}.json"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({"shard": shard.name, "samples": scan_shard(shard)}) + "\n")
            read += 1
        bar.update(1)
    bar.close()
    return {"shards": len(shards), "mine": len(mine), "encoded": encoded, "read": read}


def scan_shard(path: Path) -> list[list]:
    """The samples of a tar shard in order (grouped by key as `corpora.webdataset.iter_shard` groups them), each
    [key, image offset, image bytes, sha256, width, height, url, caption]; a sample without an image is an error
    naming it (extraction refuses it too)."""
    out: list[list] = []
    current: dict | None = None
    for key, ext, member, tar in tar_files(path, ValueError):
        if current is None or current["key"] != key:
            if current is not None:
                out.append(_sample(path, current))
            current = {"key": key, "images": {}}
        if ext in IMAGE_EXTS:
            current["images"][ext] = (member.offset_data, tar.extractfile(member).read())
        elif ext in (".json", ".txt"):
            current[ext] = tar.extractfile(member).read()
    if current is not None:
        out.append(_sample(path, current))
    return out


def _sample(path: Path, s: dict) -> list:
    ext = next((e for e in IMAGE_EXTS if e in s["images"]), None)
    if ext is None:
        raise ValueError(f"{path}: sample {s['key']} has no image")
    offset, data = s["images"][ext]
    try:
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"{path}: sample {s['key']}: unreadable image ({exc})") from None
    meta, caption = sample_text(path, s["key"], s.get(".json"), s.get(".txt"), ValueError)
    url = meta.get("url") if isinstance(meta, dict) else None
    return [s["key"], offset, len(data), hashlib.sha256(data).hexdigest(), width, height,
            url if isinstance(url, str) else None, caption if isinstance(caption, str) else None]


def _check_parts(features: Path, record: dict | None, names: list[str], pattern: str, cfg: ShardIndexConfig,
                 backbone) -> str:
    """Every shard of the pattern has a finished part of this backbone's weights; returns their precision."""
    from ..features import FeatureCache
    fix = (f"extract them: `foco features extract --in '{pattern}' --backbone {cfg.backbone} --out {features}`"
           if cfg.features else "rerun the same command to encode them")
    if record is None:
        raise FileNotFoundError(f"{features / 'corpus.json'} is missing: no shard was encoded yet; {fix}")
    have = set(record["parts"])
    missing = [n for n in names if n not in have]
    if missing:
        raise ValueError(f"{features / 'corpus.json'} holds no features of {len(missing)} of the {len(names)} shards "
                         f"of --in {pattern}, e.g. {missing[0]}; {fix}")
    sha = getattr(backbone, "weights_sha256", None)
    if sha and record.get("backbone_sha256") and record["backbone_sha256"] != sha:
        raise ValueError(f"{features / 'corpus.json'}: its features were extracted with other weights of "
                         f"{cfg.backbone} (sha256 {record['backbone_sha256'][:12]}..., now {sha[:12]}...); restore "
                         "the weights, or encode the shards again into a new --out")
    precision = None
    for name in names:
        part = features / "parts" / name
        if not (part / "done.json").is_file():
            raise ValueError(f"{part}: the features of shard {name} are not finished (no done.json); {fix}")
        cache = FeatureCache(part)
        spec, weights = cache.backbone["spec"], cache.backbone["weights_sha256"]
        precision = precision or cache.manifest.get("precision", "fp32")
        if canonical_spec(spec or "") != canonical_spec(cfg.backbone) or (sha and weights and weights != sha):
            raise ValueError(f"{part / 'manifest.json'}: features of backbone {spec!r} (weights sha256 "
                             f"{str(weights)[:12]}...), not of --backbone {cfg.backbone!r} now; extract the corpus "
                             "again into a new --features folder")
    return precision or "fp32"


def fill_index(cfg: ShardIndexConfig, out: str | Path, backbone=None, device: str = "cpu") -> IndexStats:
    """Step 2, one process (module docstring): the index of every shard of the pattern, in shard order."""
    out = Path(out)
    pattern, features, record = _corpus(cfg, out)
    names = _names(pattern)
    backbone = backbone or create_backbone(cfg.backbone, device=device)
    precision = _check_parts(features, record, names, pattern, cfg, backbone)
    meta = {"format_version": FORMAT_VERSION, "images": os.path.abspath(pattern), "source": "shards",
            "features": str(features.resolve()), "backbone": canonical_spec(cfg.backbone),
            "index_type": cfg.index_type, "with_patches": False, "precision": precision,
            "train_size": cfg.train_size, "max_index_memory": cfg.max_index_memory}
    previous_meta = None
    if (out / "index.json").is_file():
        previous_meta = read_meta(out)
        diff = [f"{k} {previous_meta.get(k)!r} (now {v!r})" for k, v in meta.items()
                if k not in ("index_type", "train_size", "max_index_memory") and previous_meta.get(k) != v]
        if diff:
            raise ValueError(f"{out} indexes with " + ", ".join(diff) + "; rerun with its settings, or choose "
                             "another --out")
    with _exclusive(out):
        return _fill(cfg, out, meta, previous_meta, names, features, backbone, device)


def _fill(cfg: ShardIndexConfig, out: Path, meta: dict, previous_meta: dict | None, names: list[str],
          features: Path, backbone, device: str) -> IndexStats:
    t0 = time.time()
    sha = getattr(backbone, "weights_sha256", None) or (previous_meta or {}).get("backbone_sha256")
    previous = (previous_meta or {}).get("vectors")
    atomic_write_text(out / "index.json", json.dumps({**meta, "building": True, "vectors": previous,
                                                      "backbone_sha256": sha}, indent=2) + "\n")
    added = kept = 0
    with ImageStore(out / "images.sqlite") as store:
        bar = Bar(len(names), "filling the index from the shards")
        for name in names:
            n_new, n_kept = _fill_shard(store, out, features, name)
            added, kept = added + n_new, kept + n_kept
            bar.update(1)
        bar.close()
        icfg = IndexConfig(images=meta["images"], backbone=cfg.backbone, index_type=cfg.index_type,
                           precision=meta["precision"], train_size=cfg.train_size,
                           max_index_memory=cfg.max_index_memory, ondisk=cfg.ondisk, refine=cfg.refine)
        vec = _vector_index(store, out, icfg, previous, gpu=device.startswith("cuda"))
        indexed, dim = store.count(), store.dim()
    atomic_write_text(out / "skipped.tsv", "path\treason\n")  # nothing is skipped: extraction refuses a bad sample
    seconds = time.time() - t0
    stats = IndexStats(indexed, added, kept, 0, 0, 0, round(seconds, 2),
                       round(added / seconds, 1) if added and seconds else 0.0, vec.get("growth"))
    atomic_write_text(out / "index.json", json.dumps({**meta, "dim": dim, "count": indexed, "vectors": vec,
                                                      "backbone_sha256": sha, "files": _stamps(out, previous_meta),
                                                      "last_run": asdict(stats)}, indent=2) + "\n")
    return stats


def _fill_shard(store: ImageStore, out: Path, features: Path, name: str) -> tuple[int, int]:
    """Appends the rows of shard `name` not yet in the store; returns (appended, already there)."""
    from ..features import FeatureCache
    path = out / "samples" / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the rank that encodes shard {name} did not finish; rerun the "
                                "same command")
    record = read_json(path)
    samples, shard = record["samples"], record["shard"]
    paths = [f"{shard}#{s[0]}" for s in samples]
    have = store.paths_from(f"{shard}#", f"{shard}$")
    if len(have) == len(paths):
        return 0, len(have)
    if sorted(paths[:len(have)]) != have:
        raise ValueError(f"{store.path}: the rows of shard {shard} are not the first {len(have)} of its samples: the "
                         "index is damaged; build it again into a new --out")
    ids, rows = FeatureCache(features / "parts" / name).rows("images")
    if ids != [s[0] for s in samples]:
        raise ValueError(f"{features / 'parts' / name}: its images are not the samples of {shard} now ({len(ids)} "
                         f"features, {len(samples)} samples); extract the shard again into a new --features folder")
    try:
        for start in range(len(have), len(paths), FILL_ROWS):
            end = min(start + FILL_ROWS, len(paths))
            vecs = rows.rows("global", np.arange(start, end)).float().numpy()
            vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
            part = samples[start:end]
            store.append([ImageRow(0, p, s[2], 0, s[3], s[4], s[5]) for p, s in zip(paths[start:end], part)],
                         vecs, [(s[1], s[6], s[7]) for s in part])
    finally:
        rows.close()
    return len(paths) - len(have), len(have)


def build_from_shards(cfg: ShardIndexConfig, out: str | Path, device: str = "cpu", rank: int = 0,
                      world_size: int = 1, wait: Callable[[], None] = lambda: None
                      ) -> tuple[dict, IndexStats | None]:
    """Both steps: this rank's `encode_shards`, then `wait()` (the ranks' barrier, e.g. leaving the process group
    once every rank arrives), then `fill_index` on rank 0 (None on the others)."""
    _corpus(cfg, Path(out))  # a --features corpus of another backbone is refused before the backbone loads
    backbone = create_backbone(cfg.backbone, device=device)
    done = encode_shards(cfg, out, backbone, device, rank, world_size)
    wait()
    return done, (fill_index(cfg, out, backbone, device) if rank == 0 else None)


@lru_cache(maxsize=8)
def _shard_files(pattern: str) -> dict[str, str]:
    return {Path(p).name: p for p in expand_pattern(pattern)}


def open_sample(pattern: str, row: ImageRow, offset: int) -> Image.Image:
    """The image of a shard-built index's `row` (`<shard>#<key>`), read from its tar at `offset`, decoded as
    extraction decodes it (RGB)."""
    shard = row.path.rsplit("#", 1)[0]
    path = _shard_files(pattern).get(shard)
    if path is None or not os.path.isfile(path):
        raise FileNotFoundError(f"shard {shard} of {pattern} is no longer on disk")
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), row.size, offset)
    if len(data) != row.size or hashlib.sha256(data).hexdigest() != row.sha256:
        raise ValueError(f"{path}: the image of {row.path} is not the one indexed (the shard changed)")
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")
