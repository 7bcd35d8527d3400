"""The feature cache: encode a split once into shards with ids, so training and evaluation never re-encode.

Layout of a cache folder::

    manifest.json                       backbone spec and its weights' sha256, dimensions, dtype, what the items
                                        come from (`source`), and fingerprints of each item list and its ids
    images/shard-00000.safetensors      global (n, D), patches (n, P, D)
    images/shard-00000.json             {"ids": [...], "sha256": ..., "ids_sha256": ...}: written after its
                                        tensors, so it marks the shard done; records their content hash and the
                                        hash of its id list
    texts/shard-00000.safetensors       global (n, D); tokens (T, D) ragged, offsets (n + 1,): text i's tokens are
                                        rows offsets[i]:offsets[i + 1] (none for a text stored without tokens)
    texts/shard-00000.json

Each shard's record holds the sha256 of its bytes, and their size and mtime when written, and the sha256 of its
id list; the manifest holds the fingerprint of every id in row order (`ids_fingerprint`), so that an id changed in
a record is caught by every reader and by `foco features verify`, not only a changed tensor. Extraction is resumable:
finished shards are kept, and a rerun encodes only the missing ones, and again any damaged one (repaired, never
reported as cached). Reading checks a shard's size and mtime against its record, and hashes only a shard whose
size or mtime changed: a training start over terabytes re-hashes nothing. `foco features verify` hashes every
shard (and records the size and mtime of an intact shard that was copied or touched). Reading goes by rows
(`foco.feature_store`): training reads a batch at a time, never the whole cache.

What to store is a choice of `ExtractConfig`: a training split stores tokens only for the contextual captions
(F_Comp reads them token by token) and the global vector of everything else (the local captions, the captions),
because training reads nothing more. Caches written before issue 22 store texts padded, tokens (n, L, D) and mask
(n, L); they are read as they are. A cache made with another backbone or for another item list is refused rather
than mixed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch

from .backbones.base import Backbone, ImageFeatures, TextFeatures, has_pixel_path
from .records import read as read_record
from .utils.io import atomic_write_bytes, atomic_write_text, iter_batches, load_image, read_json, sha256_file
from .utils.precision import autocast, resolve_precision
from .utils.progress import Bar

if TYPE_CHECKING:
    from .feature_store import StoredTexts

log = logging.getLogger(__name__)
_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ExtractConfig:
    shard_size: int = 2048  # items per shard
    batch_size: int = 128  # items per encoder call
    dtype: str = "float16"  # storage dtype of the features; the globals are re-normalised on load
    patches: bool = True  # store image patch features (needed by FoCo; off for a gallery-only index)
    tokens: bool = True  # store text token features
    tokens_for: frozenset[str] | None = None  # with tokens: only for these text ids (None: every text)
    out_flag: str = "--out"  # the flag that names this cache's folder, for error messages ("--cache" in foco eval)
    precision: str = "fp32"  # "bf16": encode under bf16 autocast (foco.utils.precision); part of the cache's identity
    source: dict | None = None  # what the items come from (e.g. {"world": fingerprint, "split": ...}); checked


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


def _check_manifest(out: Path, kind: str, backbone: Backbone, keys: Sequence[str], ids: Sequence[str],
                    cfg: ExtractConfig) -> None:
    path = out / "manifest.json"
    manifest = read_record("manifest.json", path) if path.is_file() else {}
    want = {"backbone": backbone.spec, "embed_dim": backbone.embed_dim, "dtype": cfg.dtype,
            "shard_size": cfg.shard_size, "precision": resolve_precision(cfg.precision)}
    have = {"precision": "fp32", **manifest} if manifest else {}  # caches from before precisions were recorded
    for k, v in want.items():
        if k in have and have[k] != v:
            raise ValueError(f"{path}: cache was made with {k}={have[k]!r}, not {v!r}; use another "
                             f"{cfg.out_flag}" + (" or the same --precision" if k == "precision" else ""))
    sha = getattr(backbone, "weights_sha256", None)
    if sha and have.get("backbone_sha256") and have["backbone_sha256"] != sha:
        raise ValueError(f"{path}: cache was made with other weights of {backbone.spec} (sha256 "
                         f"{have['backbone_sha256'][:12]}..., now {sha[:12]}...): the backbone's files changed; use "
                         f"another {cfg.out_flag}")
    if cfg.source is not None and have.get("source") not in (None, cfg.source):
        raise ValueError(f"{path}: cache holds features of {have['source']}, not of {cfg.source}; use another "
                         f"{cfg.out_flag}")
    if sha:
        want["backbone_sha256"] = sha
    if cfg.source is not None:
        want["source"] = cfg.source
    entry = {"count": len(keys), "fingerprint": _fingerprint(keys)}
    if kind in manifest and {k: manifest[kind].get(k) for k in entry} != entry:
        raise ValueError(f"{path}: cache holds another list of {kind} ({manifest[kind]['count']} items); "
                         f"use another {cfg.out_flag}")
    manifest.update(want)
    manifest[kind] = {**manifest.get(kind, {}), **entry, "ids_fingerprint": _fingerprint(ids)}
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def cache_fingerprint(manifest: dict) -> str:
    """What a cache holds, in 16 hex digits: its manifest (backbone and weights, dimensions, dtype, precision,
    source, every item list's and id list's fingerprint) without the timings of its last run."""
    kept = {k: ({kk: vv for kk, vv in v.items() if kk != "last_run"} if isinstance(v, dict) else v)
            for k, v in manifest.items()}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def _record_speed(out: Path, kind: str, n: int, seconds: float, n_shards: int) -> None:
    """Records the run's speed and, every shard being written, the kind's content hash (`content_sha256`)."""
    path = out / "manifest.json"
    manifest = read_json(path)
    manifest[kind]["content_sha256"] = content_sha256(
        [read_record("shard", out / kind / f"shard-{s:05d}.json") for s in range(n_shards)])
    if n:
        manifest[kind]["last_run"] = {"encoded": n, "seconds": round(seconds, 2), "per_second": round(n / seconds, 1)}
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _extract(kind: str, encode, backbone: Backbone, ids: list[str], payload: list, out: Path,
             cfg: ExtractConfig, inputs: Callable[[list[list[int]]], Iterable[Any]] | None = None) -> dict:
    """Encodes the items of the shards not yet written, batch by batch: `encode(x, batch_ids)` gives a batch's
    tensors, x being the batch's payload items, or, with `inputs`, what `inputs(batches)` yields for that batch
    (a loader's preprocessed tensors, consumed one batch at a time). Floating tensors are cast to the storage dtype
    where `encode` left them (the device), and only then copied to the CPU."""
    if len(set(ids)) != len(ids):
        raise ValueError(f"{kind}: ids must be unique")
    out.mkdir(parents=True, exist_ok=True)
    device = str(getattr(backbone, "device", "cpu"))  # "auto" precision resolves for the device that encodes
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device))
    _check_manifest(out, kind, backbone, [f"{i}\t{_cache_key(p)}" for i, p in zip(ids, payload)], ids, cfg)
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
    if not todo:  # a finished cache: its shards must still be the ones extraction wrote
        problem = content_problem(out, (read_json(out / "manifest.json").get(kind) or {}), kind, len(shards))
        if problem:
            raise ValueError(f"{problem}; use another {cfg.out_flag}")
    done_items = len(ids) - sum(len(shards[s]) for s in todo)
    if done_items:
        log.info("%s: %d of %d items already cached, resuming", kind, done_items, len(ids))
    dtype = _DTYPES[cfg.dtype]
    bar = Bar(len(ids), f"encoding {kind}", initial=done_items)
    t0, encoded = time.time(), 0
    plan = [(s, batch) for s in todo for batch in iter_batches(shards[s], cfg.batch_size)]  # in write order
    xs = inputs([b for _, b in plan]) if inputs is not None else ([payload[i] for i in b] for _, b in plan)
    parts: dict[str, list[torch.Tensor]] = {}
    for n, ((s, batch), x) in enumerate(zip(plan, xs, strict=True)):
        with autocast(cfg.precision, device):
            feats = encode(x, [ids[i] for i in batch])
        for name, t in feats.items():
            t = t.detach()
            parts.setdefault(name, []).append((t.to(dtype) if t.is_floating_point() else t).cpu())
        encoded += len(batch)
        bar.update(len(batch))
        if n + 1 == len(plan) or plan[n + 1][0] != s:  # the shard's last batch: write it
            tensors = {name: _cat(ts) for name, ts in parts.items()}
            if "lengths" in tensors:  # ragged tokens: their offsets
                tensors["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long, device="cpu"),
                                                tensors.pop("lengths").long().cumsum(0)])
            write_shard(shard_dir, s, tensors, [ids[i] for i in shards[s]])
            parts = {}
    bar.close()
    _record_speed(out, kind, encoded, time.time() - t0, len(shards))
    return {"items": len(ids), "encoded": encoded, "seconds": time.time() - t0, "repaired": repaired}


def write_shard(shard_dir: Path, s: int, tensors: dict[str, torch.Tensor], ids: list[str]) -> None:
    """Writes shard `s` (its tensors, then its record: ids, sha256, size and mtime) atomically."""
    from safetensors.torch import save as st_save
    data = st_save({k: v.contiguous() for k, v in tensors.items()})
    shard = shard_dir / f"shard-{s:05d}.safetensors"
    atomic_write_bytes(shard, data)
    st = shard.stat()
    atomic_write_text(shard_dir / f"shard-{s:05d}.json", json.dumps({
        "ids": ids, "sha256": hashlib.sha256(data).hexdigest(), "ids_sha256": ids_sha256(ids), "bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns}))


def content_sha256(shard_records: list[dict]) -> str | None:
    """What a kind of a cache holds: the sha256 over every shard's tensor bytes' hash and its id list's, in order
    (None for shards written before their bytes were hashed). The manifest records it when extraction finishes, so
    that a shard and its record copied from another cache (another backbone's, another split's) are refused."""
    if any(r.get("sha256") is None for r in shard_records):
        return None
    h = hashlib.sha256()
    for r in shard_records:
        h.update(f"{r['sha256']}:{ids_sha256(r['ids'])}\n".encode())
    return h.hexdigest()


def content_problem(path: Path, entry: dict, kind: str, n_shards: int,
                    shard_records: list[dict] | None = None) -> str | None:
    """What is wrong with a kind's shards against the content hash its manifest entry records, or None (also for
    a cache written before content hashes were recorded)."""
    want = entry.get("content_sha256")
    if want is None:
        return None
    if shard_records is None:
        shard_records = [read_record("shard", path / kind / f"shard-{s:05d}.json") for s in range(n_shards)]
    unhashed = next((s for s, r in enumerate(shard_records) if r.get("sha256") is None), None)
    if unhashed is not None:
        return (f"{path / kind / f'shard-{unhashed:05d}.json'} records no sha256 of its shard's bytes, which "
                f"{path / 'manifest.json'} (content_sha256) says extraction wrote: the record was edited")
    if content_sha256(shard_records) != want:
        return (f"{path / kind}: the shards differ from those {path / 'manifest.json'} recorded when extraction "
                "finished (content_sha256): a shard or its record was replaced, e.g. copied from another cache")
    return None


def ids_sha256(ids: Sequence[str]) -> str:
    """The hash of an id list, in order (each id NUL-terminated)."""
    h = hashlib.sha256()
    for i in ids:
        h.update(str(i).encode("utf-8") + b"\0")
    return h.hexdigest()


def shard_problem(shard_dir: Path, s: int, deep: bool = False) -> str | None:
    """None when shard `s` is finished and intact; otherwise what is wrong with it. A shard whose size and mtime
    match its record is taken as intact unless `deep` (hash every byte); one that differs is hashed. Shards written
    before hashes were recorded are taken as they are."""
    meta, shard = shard_dir / f"shard-{s:05d}.json", shard_dir / f"shard-{s:05d}.safetensors"
    if not meta.is_file():
        return "not encoded yet"
    if not shard.is_file():
        return "its tensors are missing"
    try:
        record = read_record("shard", meta)
    except ValueError as exc:
        return f"its record {meta.name} is damaged ({str(exc).split(': ', 1)[-1]})"
    ids = record["ids"]
    if "ids_sha256" in record and ids_sha256(ids) != record["ids_sha256"]:
        return f"its id list does not match the ids_sha256 recorded in {meta.name} (ids edited since extraction)"
    want = record.get("sha256")
    if want is None:
        return None
    if not deep and _stamp_matches(shard, record):
        return None
    if sha256_file(shard) != want:
        return "its bytes do not match the sha256 recorded in " + meta.name
    return None


def _stamp_matches(shard: Path, record: dict) -> bool:
    st = shard.stat()
    return record.get("bytes") == st.st_size and record.get("mtime_ns") == st.st_mtime_ns


def verify_cache(path: str | Path) -> dict:
    """Hashes every shard of a cache against its recorded sha256: {kind: {"shards", "bad": [messages]}}. An intact
    shard whose size or mtime no longer match its record (copied, touched) gets them recorded again, so that reads
    need not hash it."""
    path = Path(path)
    manifest = read_record("manifest.json", path / "manifest.json")
    report = {}
    for kind in ("images", "texts"):
        if kind not in manifest:
            continue
        n_shards = -(-manifest[kind]["count"] // manifest["shard_size"])
        bad = []
        for s in range(n_shards):
            problem = shard_problem(path / kind, s, deep=True)
            if problem is not None:
                bad.append(f"{path / kind / f'shard-{s:05d}.safetensors'}: {problem}")
            else:
                _restamp(path / kind, s)
        if not bad:
            shard_records = [read_record("shard", path / kind / f"shard-{s:05d}.json") for s in range(n_shards)]
            problem = (ids_problem(path, manifest, kind, [i for r in shard_records for i in r["ids"]])
                       or content_problem(path, manifest[kind], kind, n_shards, shard_records))
            if problem:
                bad.append(problem)
        report[kind] = {"shards": n_shards, "bad": bad}
    return report


def ids_problem(path: Path, manifest: dict, kind: str, ids: list[str]) -> str | None:
    """What is wrong with a kind's ids in row order against the manifest (their count and fingerprint), or None.
    Caches written before the fingerprint was recorded are checked by count only."""
    entry = manifest.get(kind) or {}
    if len(ids) != entry.get("count"):
        return (f"{path / kind}: the shard records hold {len(ids)} ids, but {path / 'manifest.json'} counts "
                f"{entry.get('count')}")
    want = entry.get("ids_fingerprint")
    if want is not None and _fingerprint(ids) != want:
        return (f"{path / kind}: the shard records' ids differ from those {path / 'manifest.json'} recorded at "
                "extraction (an id list was edited)")
    return None


def _restamp(shard_dir: Path, s: int) -> None:
    meta, shard = shard_dir / f"shard-{s:05d}.json", shard_dir / f"shard-{s:05d}.safetensors"
    record = read_record("shard", meta)
    if record.get("sha256") is None or _stamp_matches(shard, record) or not os.access(meta.parent, os.W_OK):
        return
    st = shard.stat()
    atomic_write_text(meta, json.dumps({**record, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}))


def _cat(ts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenates along dim 0, right-padding dim 1 (token length) when the parts differ."""
    if ts[0].ndim >= 2 and len({t.shape[1] for t in ts}) > 1:
        L = max(t.shape[1] for t in ts)
        ts = [torch.nn.functional.pad(t, [0, 0] * (t.ndim - 2) + [0, L - t.shape[1]]) for t in ts]
    return torch.cat(ts, 0)


def extract_images(backbone: Backbone, items: Sequence[tuple[str, Any]], out: str | Path,
                   cfg: ExtractConfig = ExtractConfig(),
                   pixel_batches: Callable[[Sequence[Any], Callable[[Any], torch.Tensor], list[list[int]]],
                                           Iterable[torch.Tensor]] | None = None) -> dict:
    """Encodes images given as (id, source) into `out`/images. A source is a path, or an object with `load()`
    returning a PIL image and a `str()` that identifies it (e.g. a crop: `foco.benchmarks.ImageRef`).
    Unreadable images raise, naming the file.

    A backbone that preprocesses apart from encoding (`foco.backbones.base.PixelBackbone`) encodes pixels:
    `pixel_batches(sources, transform, batches)` yields the (b, 3, H, W) pixels of each batch of indices into the
    sources, in order (DataLoader workers: `foco.corpora.loader.pixel_batches`); without it they are made here,
    a batch at a time. The features stay on the backbone's device until cast to the storage dtype. Any other
    backbone is given each batch's decoded images (`encode_images`)."""
    sources = [s if hasattr(s, "load") else Path(s) for _, s in items]  # paths: keyed resolved (`_cache_key`)
    if not has_pixel_path(backbone):
        def encode_pil(batch, _ids):
            f = backbone.encode_images([s.load() if hasattr(s, "load") else load_image(s) for s in batch])
            return _image_tensors(f, cfg)
        return _extract("images", encode_pil, backbone, [i for i, _ in items], sources, Path(out), cfg)
    transform = backbone.image_transform()
    dev = getattr(backbone, "device", "cpu")

    def here(batches):  # this process, a batch at a time
        for b in batches:
            yield torch.stack([transform(sources[i].load() if hasattr(sources[i], "load") else load_image(sources[i]))
                               for i in b])  # (b, 3, H, W)

    def encode(pixels, _ids):  # pixels (b, 3, H, W)
        return _image_tensors(backbone.encode_pixels(pixels, device=dev), cfg)
    inputs = (lambda batches: pixel_batches(sources, transform, batches)) if pixel_batches is not None else here
    return _extract("images", encode, backbone, [i for i, _ in items], sources, Path(out), cfg, inputs=inputs)


def _image_tensors(f: ImageFeatures, cfg: ExtractConfig) -> dict[str, torch.Tensor]:
    return {"global": f.global_, **({"patches": f.patches} if cfg.patches else {}),
            **({"global_norm": f.norm.float()} if f.norm is not None else {})}  # (n,): raw = global * norm


def extract_texts(backbone: Backbone, items: Sequence[tuple[str, str]], out: str | Path,
                  cfg: ExtractConfig = ExtractConfig()) -> dict:
    """Encodes texts given as (id, text) into `out`/texts, tokens ragged (module docstring): every text's tokens,
    or only those of `cfg.tokens_for`. Texts are stored shortest first, so that an encoder batch wastes little
    padding; read them back by id."""
    items = sorted(items, key=lambda it: len(it[1]))
    def encode(texts, text_ids):
        # a text repeated in the batch is encoded once (local phrases repeat: "a dog"); sorted by length, repeats
        # mostly share a batch, and the batch's padded length is the same with or without them
        unique = list(dict.fromkeys(texts))
        f = backbone.encode_texts(unique)
        if len(unique) < len(texts):
            row = {t: r for r, t in enumerate(unique)}
            idx = torch.tensor([row[t] for t in texts], device=f.global_.device)
            f = type(f)(f.global_[idx], f.tokens[idx], f.mask[idx])
        if not cfg.tokens:
            return {"global": f.global_}
        lengths = f.mask.sum(1).cpu()  # (n,) real tokens (right-padded)
        if cfg.tokens_for is not None:
            lengths = lengths * torch.tensor([i in cfg.tokens_for for i in text_ids], dtype=lengths.dtype, device="cpu")
        keep = torch.arange(f.mask.shape[1], device="cpu")[None, :] < lengths[:, None]  # (n, L), on the CPU
        return {"global": f.global_, "tokens": f.tokens.cpu()[keep], "lengths": lengths}  # tokens (T, D)
    return _extract("texts", encode, backbone, [i for i, _ in items], [t for _, t in items], Path(out), cfg)


def _norms(rows, idx) -> torch.Tensor | None:
    """(n,) float32 norms of the raw image globals, or None for a cache written before foco kept them."""
    return rows.rows("global_norm", idx).float() if rows.has("global_norm") else None


_FIX = "rerun the `foco features extract` command that made this cache: it encodes damaged shards again"


class FeatureCache:
    """Read access to a cache folder: a kind's shards as one row space (`rows`, read a batch at a time), or whole
    (`images`, `texts`: for benchmark-sized caches)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = read_record("manifest.json", self.path / "manifest.json")

    @property
    def backbone(self) -> dict:
        """The backbone the cache was made with: {"spec", "weights_sha256"} (None where not recorded)."""
        return {"spec": self.manifest.get("backbone"), "weights_sha256": self.manifest.get("backbone_sha256")}

    def check_source(self, key: str, value, what: str, fix: str) -> None:
        """Refuses a cache whose recorded source (`ExtractConfig.source`) has another `key` than `value` (e.g. the
        world's fingerprint), naming both and `fix`; a cache that records none is not compared."""
        have = (self.manifest.get("source") or {}).get(key)
        if have is not None and value is not None and have != value:
            raise ValueError(f"{self.path} holds features of {key} {have}, not of {what} ({key} {value}); {fix}")

    def _n_shards(self, kind: str) -> int:
        entry = self.manifest.get(kind)
        if entry is None:
            raise KeyError(f"{self.path} holds no {kind}")
        return -(-entry["count"] // self.manifest["shard_size"])

    def _records(self, kind: str) -> list[dict]:
        """Every shard's record, each shard checked (size and mtime; hashed only when they changed)."""
        shard_dir = self.path / kind
        records = []
        unstamped = 0
        for s in range(self._n_shards(kind)):
            meta = shard_dir / f"shard-{s:05d}.json"
            if not meta.is_file():
                raise FileNotFoundError(f"{meta} is missing: extraction did not finish; rerun `foco features extract`")
            problem = shard_problem(shard_dir, s)
            if problem is not None:
                raise ValueError(f"{shard_dir / f'shard-{s:05d}.safetensors'}: {problem}; {_FIX}")
            records.append(read_record("shard", meta))
            unstamped += "sha256" in records[-1] and "bytes" not in records[-1]
        problem = content_problem(self.path, self.manifest[kind], kind, len(records), records)
        if problem:
            raise ValueError(f"{problem}; {_FIX} into a new --out")
        if unstamped:
            log.warning("%s: %d shards record no size and mtime (written before they were recorded), so they were "
                        "hashed to be checked; `foco features verify --cache %s` records them once", shard_dir,
                        unstamped, self.path)
        return records

    def ids(self, kind: str) -> list[str]:
        """The ids of `kind` ("images" or "texts") in row order, read from the shard records alone, checked against
        the manifest's fingerprint of them."""
        shard_dir = self.path / kind
        return self._checked_ids(kind, [i for s in range(self._n_shards(kind))
                                        for i in read_record("shard", shard_dir / f"shard-{s:05d}.json")["ids"]])

    def _checked_ids(self, kind: str, ids: list[str]) -> list[str]:
        problem = ids_problem(self.path, self.manifest, kind, ids)
        if problem:
            raise ValueError(f"{problem}; {_FIX} into a new --out")
        return ids

    def rows(self, kind: str) -> tuple[list[str], "Rows"]:
        """Ids in row order and the kind's shards as one row space (`foco.feature_store.Rows`), every shard checked
        by size and mtime; nothing is read yet."""
        from .feature_store import Rows
        records = self._records(kind)
        paths = [self.path / kind / f"shard-{s:05d}.safetensors" for s in range(len(records))]
        ids = self._checked_ids(kind, [i for r in records for i in r["ids"]])
        return ids, Rows(paths, [len(r["ids"]) for r in records], _FIX)

    def images(self, dtype: torch.dtype | None = torch.float32, patches: bool = True
               ) -> tuple[list[str], ImageFeatures]:
        """Ids and every image's features; globals are float32 and re-normalised, patches in `dtype` (None: as
        stored; `patches=False`: none read)."""
        ids, rows = self.rows("images")
        every = range(len(ids))
        g = torch.nn.functional.normalize(rows.rows("global", every).float(), dim=-1)
        p = (rows.rows("patches", every) if patches and rows.has("patches")
             else torch.empty(len(ids), 0, g.shape[1], device="cpu"))
        norm = _norms(rows, every)
        rows.close()
        return ids, ImageFeatures(g, p if dtype is None else p.to(dtype), norm)

    def stored_images(self, dtype: torch.dtype | None = torch.float32) -> tuple[list[str], ImageFeatures]:
        """Ids and the images' features as training and evaluation read them: globals (n, D) float32, re-normalised,
        in memory; patches a `RowView` (n, P, D) that reads the rows a batch asks for from the shards, in `dtype`
        (None: as stored). Nothing corpus-sized but the globals is read."""
        from .feature_store import RowView
        ids, rows = self.rows("images")
        g = torch.nn.functional.normalize(rows.rows("global", range(len(ids))).float(), dim=-1)
        norm = _norms(rows, range(len(ids)))
        if not rows.has("patches"):
            return ids, ImageFeatures(g, torch.empty(len(ids), 0, g.shape[1], device="cpu"), norm)
        return ids, ImageFeatures(g, RowView(rows, "patches", dtype), norm)

    def stored_texts(self, dtype: torch.dtype | None = torch.float32) -> tuple[list[str], StoredTexts]:
        """Ids and the texts' features as training and evaluation read them: globals (n, D) float32, re-normalised,
        in memory; tokens read a batch at a time (`StoredTexts.take`), in `dtype` (None: as stored)."""
        from .feature_store import StoredTexts, TokenView
        ids, rows = self.rows("texts")
        g = torch.nn.functional.normalize(rows.rows("global", range(len(ids))).float(), dim=-1)
        if not rows.has("tokens"):
            empty = torch.empty(len(ids), 0, g.shape[1], device="cpu")
            no_mask = torch.empty(len(ids), 0, dtype=torch.bool, device="cpu")
            return ids, StoredTexts(g, TokenView.padded(empty, no_mask))
        return ids, StoredTexts(g, TokenView(rows, dtype))

    def texts(self, dtype: torch.dtype | None = torch.float32) -> tuple[list[str], TextFeatures]:
        """Ids and every text's features; globals are float32 and re-normalised, tokens in `dtype` (None: as stored),
        padded to the longest text."""
        ids, rows = self.rows("texts")
        every = range(len(ids))
        g = torch.nn.functional.normalize(rows.rows("global", every).float(), dim=-1)
        if rows.has("tokens"):
            tokens, mask = rows.tokens(every)
            rows.close()
            return ids, TextFeatures(g, tokens if dtype is None else tokens.to(dtype), mask)
        rows.close()
        return ids, TextFeatures(g, torch.empty(len(ids), 0, g.shape[1], device="cpu"),
                                 torch.empty(len(ids), 0, dtype=torch.bool, device="cpu"))
