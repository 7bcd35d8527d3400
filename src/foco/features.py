"""The feature cache: encode a split once into shards with ids, so training and evaluation never re-encode.

Layout of a cache folder::

    manifest.json                       backbone spec, dimensions, dtype, and a fingerprint of each item list
    images/shard-00000.safetensors      global (n, D), patches (n, P, D)
    images/shard-00000.json             {"ids": [...], "sha256": ...}: written after its tensors, so it marks the
                                        shard done, and records their content hash
    texts/shard-00000.safetensors       global (n, D), tokens (n, L, D), mask (n, L)
    texts/shard-00000.json

Extraction is resumable: finished shards are kept, and a rerun encodes only the missing ones, and again any shard
whose bytes no longer match their recorded sha256 (a damaged file is repaired, never reported as cached). Reading
checks the same hash. A cache made with another backbone or for another item list is refused rather than mixed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from .backbones.base import Backbone, ImageFeatures, TextFeatures
from .utils.io import atomic_write_bytes, atomic_write_text, iter_batches, load_image, read_json, sha256_file
from .utils.precision import autocast, resolve_precision
from .utils.progress import Bar

log = logging.getLogger(__name__)
_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ExtractConfig:
    shard_size: int = 2048  # items per shard
    batch_size: int = 128  # items per encoder call
    dtype: str = "float16"  # storage dtype of the features; the globals are re-normalised on load
    patches: bool = True  # store image patch features (needed by FoCo; off for a gallery-only index)
    tokens: bool = True  # store text token features
    out_flag: str = "--out"  # the flag that names this cache's folder, for error messages ("--cache" in foco eval)
    precision: str = "fp32"  # "bf16": encode under bf16 autocast (foco.utils.precision); part of the cache's identity


def _cache_key(item: Any) -> str:
    """An item's identity in a cache: a text as it is, an image file by its resolved path (so that `exp/cirr` and
    its absolute path are one cache), a crop with its box."""
    if isinstance(item, Path):
        return os.path.realpath(item)
    if hasattr(item, "path") and hasattr(item, "box"):
        base = os.path.realpath(item.path)
        return base if item.box is None else f"{base}#box={','.join(f'{v:g}' for v in item.box)}"
    return str(item)


def _fingerprint(keys: Sequence[str]) -> str:
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode("utf-8") + b"\0")
    return h.hexdigest()[:16]


def _check_manifest(out: Path, kind: str, backbone: Backbone, keys: Sequence[str], cfg: ExtractConfig) -> None:
    path = out / "manifest.json"
    manifest = read_json(path) if path.is_file() else {}
    want = {"backbone": backbone.spec, "embed_dim": backbone.embed_dim, "dtype": cfg.dtype,
            "shard_size": cfg.shard_size, "precision": resolve_precision(cfg.precision)}
    have = {"precision": "fp32", **manifest} if manifest else {}  # caches from before precisions were recorded
    for k, v in want.items():
        if k in have and have[k] != v:
            raise ValueError(f"{path}: cache was made with {k}={have[k]!r}, not {v!r}; use another "
                             f"{cfg.out_flag}" + (" or the same --precision" if k == "precision" else ""))
    entry = {"count": len(keys), "fingerprint": _fingerprint(keys)}
    if kind in manifest and {k: manifest[kind][k] for k in entry} != entry:
        raise ValueError(f"{path}: cache holds another list of {kind} ({manifest[kind]['count']} items); "
                         f"use another {cfg.out_flag}")
    manifest.update(want)
    manifest[kind] = {**manifest.get(kind, {}), **entry}
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _record_speed(out: Path, kind: str, n: int, seconds: float) -> None:
    path = out / "manifest.json"
    manifest = read_json(path)
    if n:
        manifest[kind]["last_run"] = {"encoded": n, "seconds": round(seconds, 2), "per_second": round(n / seconds, 1)}
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _extract(kind: str, encode, backbone: Backbone, ids: list[str], payload: list, out: Path,
             cfg: ExtractConfig) -> dict:
    from safetensors.torch import save as st_save
    if len(set(ids)) != len(ids):
        raise ValueError(f"{kind}: ids must be unique")
    out.mkdir(parents=True, exist_ok=True)
    _check_manifest(out, kind, backbone, [f"{i}\t{_cache_key(p)}" for i, p in zip(ids, payload)], cfg)
    shard_dir = out / kind
    shard_dir.mkdir(exist_ok=True)
    for stale in shard_dir.glob(".shard-*.tmp"):  # a killed run's unfinished write (see atomic_write_bytes)
        stale.unlink()
    shards = list(iter_batches(list(range(len(ids))), cfg.shard_size))
    todo, repaired = [], 0
    for s in range(len(shards)):
        problem = shard_problem(shard_dir, s)
        if problem is not None:
            todo.append(s)
            if problem != "not encoded yet":
                repaired += 1
                log.warning("%s: %s; encoding it again", shard_dir / f"shard-{s:05d}.safetensors", problem)
    done_items = len(ids) - sum(len(shards[s]) for s in todo)
    if done_items:
        log.info("%s: %d of %d items already cached, resuming", kind, done_items, len(ids))
    dtype = _DTYPES[cfg.dtype]
    bar = Bar(len(ids), f"encoding {kind}", initial=done_items)
    t0, encoded = time.time(), 0
    for s in todo:
        parts: dict[str, list[torch.Tensor]] = {}
        for batch in iter_batches(shards[s], cfg.batch_size):
            with autocast(cfg.precision):
                feats = encode([payload[i] for i in batch])
            for name, t in feats.items():
                parts.setdefault(name, []).append(t)
            encoded += len(batch)
            bar.update(len(batch))
        tensors = {name: _cat(ts).to(dtype) if ts[0].is_floating_point() else _cat(ts)
                   for name, ts in parts.items()}
        data = st_save(tensors)
        atomic_write_bytes(shard_dir / f"shard-{s:05d}.safetensors", data)
        atomic_write_text(shard_dir / f"shard-{s:05d}.json", json.dumps({"ids": [ids[i] for i in shards[s]],
                                                                         "sha256": hashlib.sha256(data).hexdigest()}))
    bar.close()
    _record_speed(out, kind, encoded, time.time() - t0)
    return {"items": len(ids), "encoded": encoded, "seconds": time.time() - t0, "repaired": repaired}


def shard_problem(shard_dir: Path, s: int) -> str | None:
    """None when shard `s` is finished and intact; otherwise what is wrong with it. Shards written before hashes
    were recorded are taken as they are."""
    meta, shard = shard_dir / f"shard-{s:05d}.json", shard_dir / f"shard-{s:05d}.safetensors"
    if not meta.is_file():
        return "not encoded yet"
    if not shard.is_file():
        return "its tensors are missing"
    try:
        want = read_json(meta).get("sha256")
    except ValueError:
        return f"its record {meta.name} is unreadable"
    if want is not None and sha256_file(shard) != want:
        return "its bytes do not match the sha256 recorded in " + meta.name
    return None


def verify_cache(path: str | Path) -> dict:
    """Checks every shard of a cache against its recorded sha256: {kind: {"shards", "bad": [messages]}}."""
    path = Path(path)
    manifest = read_json(path / "manifest.json")
    report = {}
    for kind in ("images", "texts"):
        if kind not in manifest:
            continue
        n_shards = -(-manifest[kind]["count"] // manifest["shard_size"])
        bad = [f"{path / kind / f'shard-{s:05d}.safetensors'}: {p}" for s in range(n_shards)
               if (p := shard_problem(path / kind, s)) is not None]
        report[kind] = {"shards": n_shards, "bad": bad}
    return report


def _cat(ts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenates along dim 0, right-padding dim 1 (token length) when the parts differ."""
    if ts[0].ndim >= 2 and len({t.shape[1] for t in ts}) > 1:
        L = max(t.shape[1] for t in ts)
        ts = [torch.nn.functional.pad(t, [0, 0] * (t.ndim - 2) + [0, L - t.shape[1]]) for t in ts]
    return torch.cat(ts, 0)


def extract_images(backbone: Backbone, items: Sequence[tuple[str, Any]], out: str | Path,
                   cfg: ExtractConfig = ExtractConfig()) -> dict:
    """Encodes images given as (id, source) into `out`/images. A source is a path, or an object with `load()`
    returning a PIL image and a `str()` that identifies it (e.g. a crop: `foco.benchmarks.ImageRef`).
    Unreadable images raise, naming the file."""
    def encode(sources):
        f = backbone.encode_images([s.load() if hasattr(s, "load") else load_image(s) for s in sources])
        return {"global": f.global_, **({"patches": f.patches} if cfg.patches else {})}
    sources = [s if hasattr(s, "load") else Path(s) for _, s in items]  # paths: keyed resolved (`_cache_key`)
    return _extract("images", encode, backbone, [i for i, _ in items], sources, Path(out), cfg)


def extract_texts(backbone: Backbone, items: Sequence[tuple[str, str]], out: str | Path,
                  cfg: ExtractConfig = ExtractConfig()) -> dict:
    """Encodes texts given as (id, text) into `out`/texts. Texts are stored shortest first, so that batches of
    similar length waste little padding; read them back by id."""
    items = sorted(items, key=lambda it: len(it[1]))
    def encode(texts):
        f = backbone.encode_texts(texts)
        return {"global": f.global_, **({"tokens": f.tokens, "mask": f.mask} if cfg.tokens else {})}
    return _extract("texts", encode, backbone, [i for i, _ in items], [t for _, t in items], Path(out), cfg)


class FeatureCache:
    """Read access to a cache folder: all shards of a kind, concatenated in id order of extraction."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = read_json(self.path / "manifest.json")

    def ids(self, kind: str) -> list[str]:
        """The ids of `kind` ("images" or "texts") in row order, read from the shard records alone."""
        entry = self.manifest.get(kind)
        if entry is None:
            raise KeyError(f"{self.path} holds no {kind}")
        n_shards = -(-entry["count"] // self.manifest["shard_size"])
        return [i for s in range(n_shards) for i in read_json(self.path / kind / f"shard-{s:05d}.json")["ids"]]

    def _load(self, kind: str) -> tuple[list[str], dict[str, torch.Tensor]]:
        from .utils.io import load_tensors
        entry = self.manifest.get(kind)
        if entry is None:
            raise KeyError(f"{self.path} holds no {kind}")
        shard_dir = self.path / kind
        ids, parts = [], {}
        n_shards = -(-entry["count"] // self.manifest["shard_size"])
        for s in range(n_shards):
            meta = shard_dir / f"shard-{s:05d}.json"
            if not meta.is_file():
                raise FileNotFoundError(f"{meta} is missing: extraction did not finish; rerun `foco features extract`")
            shard = shard_dir / f"shard-{s:05d}.safetensors"
            fix = "rerun the `foco features extract` command that made this cache: it encodes damaged shards again"
            problem = shard_problem(shard_dir, s)
            if problem is not None:
                raise ValueError(f"{shard}: {problem}; {fix}")
            ids += read_json(meta)["ids"]
            for name, t in load_tensors(shard, fix).items():
                parts.setdefault(name, []).append(t)
        return ids, {name: _cat(ts) for name, ts in parts.items()}

    def images(self, dtype: torch.dtype | None = torch.float32) -> tuple[list[str], ImageFeatures]:
        """Ids and features; globals are float32 and re-normalised, patches in `dtype` (None: as stored)."""
        ids, t = self._load("images")
        g = torch.nn.functional.normalize(t["global"].float(), dim=-1)
        patches = t["patches"] if "patches" in t else torch.empty(len(ids), 0, g.shape[1])
        return ids, ImageFeatures(g, patches if dtype is None else patches.to(dtype))

    def texts(self, dtype: torch.dtype | None = torch.float32) -> tuple[list[str], TextFeatures]:
        """Ids and features; globals are float32 and re-normalised, tokens in `dtype` (None: as stored)."""
        ids, t = self._load("texts")
        g = torch.nn.functional.normalize(t["global"].float(), dim=-1)
        if "tokens" in t:
            tokens = t["tokens"] if dtype is None else t["tokens"].to(dtype)
            return ids, TextFeatures(g, tokens, t["mask"].bool())
        return ids, TextFeatures(g, torch.empty(len(ids), 0, g.shape[1]), torch.empty(len(ids), 0, dtype=torch.bool))
