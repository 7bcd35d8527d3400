"""`foco features extract --in 'shards/{00000..00099}.tar'`: features of a webdataset corpus, one feature cache
per input shard, resumable per shard.

    OUT/parts/<shard name>/    a feature cache (`foco.features`) of that shard's images and of its captions'
                               local and contextual captions (and the captions themselves with include_captions)
    OUT/parts/<shard name>/done.json   written last: the shard is finished
    OUT/corpus.json            the pattern, the backbone, and the parts in shard order

Images are read, decoded and preprocessed by DataLoader workers (`foco.corpora.loader`), which hand back uint8
pixel batches (pinned on CUDA); the backbone encodes each batch as it arrives, so decoding overlaps encoding and
memory holds a few batches, never a shard: a shard is indexed (where each image lies in its tar, and the
captions), not read into memory. Under torchrun, rank r takes the shards
r, r + N, r + 2N, ...; `foco train` under torchrun reads the same split (`corpus_parts` with a rank), one process
reads every part, a batch at a time (`foco.train.data.build_pair_table`).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .backbones.base import Backbone
from .decompose.schema import Decomposition
from .features import ExtractConfig, extract_images, extract_texts
from .records import read as read_record
from .utils.io import atomic_write_text
from .corpora.loader import index_tar, pixel_batches
from .corpora.webdataset import shard_paths


def extract_corpus(backbone: Backbone, pattern: str, out: str | Path, cfg: ExtractConfig = ExtractConfig(),
                   decompositions: dict[str, Decomposition] | None = None, include_captions: bool = False,
                   workers: int = 2, rank: int = 0, world_size: int = 1) -> dict:
    """Encodes this rank's shards of `pattern` into `out`/parts; returns {"shards", "done_now", "skipped_done"}.
    `decompositions` maps a caption to its pairs, or is a function of one shard's captions that gives that map
    (a store's `get_many`, asked one shard at a time); every sample's caption must have one."""
    out = Path(out)
    shards = shard_paths(pattern)
    record = {"pattern": pattern, "backbone": backbone.spec, "parts": [s.stem for s in shards]}
    sha = getattr(backbone, "weights_sha256", None)
    if sha:
        record["backbone_sha256"] = sha
    if (out / "corpus.json").is_file():  # a rerun resumes the same corpus; finished parts are never re-checked
        have = read_record("corpus.json", out / "corpus.json")
        for key in ("backbone", "backbone_sha256"):
            if key in have and key in record and have[key] != record[key]:
                raise ValueError(f"{out / 'corpus.json'}: this corpus was extracted with {key} {have[key]!r}, not "
                                 f"{record[key]!r}; rerun with the same --backbone, or choose another --out")
    if rank == 0:
        atomic_write_text(out / "corpus.json", json.dumps(record, indent=2) + "\n")
    done_now = skipped = 0
    for n, shard in enumerate(shards):
        if n % world_size != rank:
            continue
        part = out / "parts" / shard.stem
        if (part / "done.json").is_file():
            skipped += 1
            continue
        samples = index_tar(shard)  # keys, where each image lies, captions: no image bytes
        missing = [s.key for s in samples if s.image is None]
        if missing:
            raise ValueError(f"{shard}: samples without an image, e.g. {missing[0]}")
        device = getattr(backbone, "device", "cpu")

        def batches_of(sources, transform, batches):  # workers read, decode and preprocess; a few batches ahead
            return pixel_batches(sources, transform, batches, workers=workers, device=device)
        extract_images(backbone, [(s.key, s.image) for s in samples], part, cfg, pixel_batches=batches_of)
        texts: dict[str, None] = {}
        contexts: set[str] = set()  # the texts whose tokens training reads (F_Comp's contexts)
        captions = sorted({s.caption for s in samples if s.caption is not None})
        decs = decompositions(captions) if callable(decompositions) else decompositions
        for s in samples:
            if include_captions:
                texts[s.caption] = None
            if decs is not None:
                dec = decs.get(s.caption)
                if dec is None:
                    raise ValueError(f"{shard}: the caption of sample {s.key} has no decomposition; decompose the "
                                     f"shards first (foco decompose --in '{pattern}')")
                for pair in dec.pairs:
                    texts[pair.local] = None
                    texts[pair.context] = None
                    contexts.add(pair.context)
        if texts:
            extract_texts(backbone, [(t, t) for t in texts], part,
                          replace(cfg, tokens_for=frozenset(contexts)) if cfg.tokens_for is None else cfg)
        atomic_write_text(part / "done.json", json.dumps({"samples": len(samples), "texts": len(texts)}) + "\n")
        done_now += 1
    return {"shards": len(shards), "done_now": done_now, "skipped_done": skipped}


def is_corpus(folder: str | Path) -> bool:
    return (Path(folder) / "corpus.json").is_file()


def corpus_parts(folder: str | Path, rank: int = 0, world_size: int = 1) -> list[str]:
    """The parts (shard names, in shard order) that rank `rank` of `world_size` trains on: r, r + N, r + 2N, ...
    (the split of the extraction)."""
    parts = read_record("corpus.json", Path(folder) / "corpus.json")["parts"]
    if len(parts) < world_size:
        raise ValueError(f"{folder} holds {len(parts)} feature shards for {world_size} ranks: every rank needs one; "
                         "export the corpus in more shards (--shard-size) or run fewer ranks")
    return [name for n, name in enumerate(parts) if n % world_size == rank]

