"""A synthetic feature corpus of N images, in the on-disk layout that `foco train --in SHARDS --features CORPUS
--decompositions STORE` reads, for measuring training's memory and time at sizes no real extraction here reaches.

    PYTHONPATH=/work/baseline/src .venv/bin/python experiments/synthetic_corpus.py --images N --out DIR
        [--shard-images 10000] [--dim 256 --patches 64 --tokens 12 --pairs 3] [--seed 0]

(PYTHONPATH: a foco whose `foco.features` writes the baseline layout below; the script checks every part it writes
and stops if the imported foco writes another.)

writes, one part (one tar shard of --shard-images images) at a time, never the whole corpus in memory:

    DIR/shards/00000.tar ...        webdataset shards (foco.corpora.webdataset.write_shards): KEY.png (1x1), KEY.txt
                                    (the caption), KEY.json; keys are 000000000, 000000001, ... across shards
    DIR/decompositions.sqlite       a DecompositionStore: every caption's --pairs (local, context) pairs, distinct per
                                    image ("object 17 a" / "context 17 a scene ..."), under settings named "oracle"
                                    (the default --decomposer of `foco train`)
    DIR/features/corpus.json        pattern, backbone, parts: as `foco features extract --in` writes it
    DIR/features/parts/<stem>/      a feature cache per shard (manifest.json, images/, texts/ with sha256 records)
                                    and done.json, written last
    DIR/synthetic.json              the arguments, written last: the corpus is complete

The feature caches are written by foco's own extraction code (`foco.features.extract_images` / `extract_texts`,
which `foco.corpus_features.extract_corpus` calls per shard) with a stand-in backbone whose encoders return random
features of the world backbone's shape: globals (D,) L2-normalised, patches (P, D) and text tokens (L, D) Gaussian
with unit expected norm per vector, fp16 on disk. So the manifest (backbone "world:pretrained", embed_dim,
dtype, shard_size, precision, count and fingerprint of each item list), the shard records and their sha256 are
exactly those of a real extraction with the same items (checked: `foco features extract --backbone world:pretrained
--in DIR/shards/... --decompositions DIR/decompositions.sqlite` of a 200-image corpus wrote the same corpus.json,
manifests bar timings, ids, done.json and tensor shapes). A local caption ("object 17 a") has 5 tokens, a context
caption --tokens (CLS and SEP included); tokens are padded per encoder batch, as MiniLM pads them.

A rerun with the same arguments keeps the finished parts (done.json) and writes the rest; other arguments over an
existing DIR are refused. The printed `foco train` command trains on the corpus (stage 2, one epoch).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.corpora.webdataset import write_shards
from foco.decompose.schema import Decomposition, LocalContextPair
from foco.decompose.store import DecompositionStore
from foco.features import ExtractConfig, extract_images, extract_texts
from foco.utils.io import atomic_write_text, read_json

BACKBONE = "world:pretrained"  # the spec a real `foco features extract --backbone world:pretrained` records
SETTINGS = {"name": "oracle", "source": "experiments/synthetic_corpus.py"}  # resolved by name: --decomposer oracle
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def tiny_png() -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (127, 127, 127)).save(buf, format="PNG")
    return buf.getvalue()


def n_tokens(text: str) -> int:
    """The stand-in tokenizer: one token per word plus CLS and SEP, at most the world backbone's 40."""
    return min(40, len(text.split()) + 2)


class RandomBackbone:
    """What `foco.features` needs of a backbone (spec, embed_dim, encode_images, encode_texts), with random outputs
    of the world backbone's shapes. Deterministic for a given seed, part and item order."""

    def __init__(self, dim: int, patches: int, seed: int):
        self.spec, self.embed_dim, self.num_patches = BACKBONE, dim, patches
        self.gen = torch.Generator().manual_seed(seed)

    def _unit(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, self.embed_dim, generator=self.gen) / self.embed_dim ** 0.5

    def encode_images(self, images: list) -> ImageFeatures:
        B = len(images)
        return ImageFeatures(torch.nn.functional.normalize(self._unit(B), dim=-1), self._unit(B, self.num_patches))

    def encode_texts(self, texts: list[str]) -> TextFeatures:
        lengths = torch.tensor([n_tokens(t) for t in texts])
        L = int(lengths.max())
        mask = torch.arange(L)[None, :] < lengths[:, None]
        tokens = self._unit(len(texts), L) * mask[..., None]
        return TextFeatures(torch.nn.functional.normalize(self._unit(len(texts)), dim=-1), tokens, mask)


class _Image:
    """An image source as `extract_images` takes it: `load()` gives what the backbone encodes (unused here), `str()`
    its identity in the cache, "<shard>.tar#<key>" exactly as `extract_corpus` names a decoded sample."""

    def __init__(self, ident: str):
        self.ident = ident

    def load(self) -> None:
        return None

    def __str__(self) -> str:
        return self.ident


def part_samples(first: int, count: int, pairs: int, tokens: int) -> list[tuple[str, Decomposition]]:
    """(key, decomposition) of the images first .. first + count - 1; every string names its image, so no text is
    shared between images or parts."""
    filler = " ".join(["scene"] * (tokens - 5))  # "context 17 a" + filler: `tokens` tokens with CLS and SEP
    out = []
    for i in range(first, first + count):
        tags = [LETTERS[k % 26] + (str(k // 26) if k >= 26 else "") for k in range(pairs)]
        ps = [LocalContextPair(f"object {i} {t}", f"context {i} {t} {filler}".strip()) for t in tags]
        caption = f"image {i}: " + "; ".join(f"object {i} {t} in its scene" for t in tags)
        out.append((f"{i:09d}", Decomposition(caption, ps, dict(SETTINGS))))
    return out


def check_layout(part: Path, images: int, texts: int, dim: int, patches: int) -> None:
    """Exits unless the part's shards hold the baseline layout's tensors: images global (n, D) and patches (n, P, D),
    texts global (n, D), tokens (n, L, D) and mask (n, L), n summing to the part's counts. The imported foco writes
    the caches; a foco that writes another layout (e.g. ragged tokens) is refused rather than silently used."""
    from safetensors import safe_open
    want = {"images": {"global": (dim,), "patches": (patches, dim)}, "texts": {"global": (dim,), "tokens": (dim,),
                                                                              "mask": ()}}
    for kind, count in (("images", images), ("texts", texts)):
        total = 0
        for shard in sorted((part / kind).glob("shard-*.safetensors")):
            with safe_open(shard, framework="pt") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            n = shapes.get("global", (0,))[0]
            ok = set(shapes) == set(want[kind]) and all(
                shapes[k][0] == n and (shapes[k][-len(tail):] == tail if tail else len(shapes[k]) == 2)
                for k, tail in want[kind].items())
            if kind == "texts" and ok:
                ok = shapes["tokens"][:2] == shapes["mask"] and len(shapes["tokens"]) == 3
            if not ok:
                import foco
                sys.exit(f"{shard} holds {shapes}, not the baseline layout ({kind}: {want[kind]} after n [and L]): "
                         f"the foco imported from {Path(foco.__file__).parent} writes another layout; run this "
                         "script with PYTHONPATH=<the baseline checkout>/src")
            total += n
        if total != count:
            sys.exit(f"{part / kind}: {total} items written, not {count}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, required=True, help="N, images in the corpus")
    p.add_argument("--out", required=True, help="output folder DIR")
    p.add_argument("--shard-images", type=int, default=10000, help="images per tar shard and feature part")
    p.add_argument("--dim", type=int, default=256, help="D (world backbone: 256)")
    p.add_argument("--patches", type=int, default=64, help="P, patches per image (world backbone: 64)")
    p.add_argument("--tokens", type=int, default=12, help="tokens of a context caption, CLS and SEP included")
    p.add_argument("--pairs", type=int, default=3, help="(local, context) pairs per caption")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.images < 1 or a.shard_images < 1 or a.pairs < 1 or not 5 <= a.tokens <= 40:
        p.error("--images, --shard-images and --pairs must be >= 1; --tokens in 5..40 (a context caption is at "
                "least 'context 17 a': 5 tokens)")
    out = Path(a.out).resolve()
    args = {k: getattr(a, k) for k in ("images", "shard_images", "dim", "patches", "tokens", "pairs", "seed")}
    record, pending = out / "synthetic.json", out / ".synthetic-args.json"  # pending: a run under way or killed
    have = read_json(record) if record.is_file() else read_json(pending) if pending.is_file() else None
    if have is None and out.exists() and any(out.iterdir()):
        sys.exit(f"{out} exists and is not a synthetic corpus: use another --out")
    if have is not None and have != args:
        sys.exit(f"{out} holds a synthetic corpus made with {have}, not {args}: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    if not record.is_file():
        atomic_write_text(pending, json.dumps(args) + "\n")

    n_parts = -(-a.images // a.shard_images)
    stems = [f"{s:05d}" for s in range(n_parts)]
    pattern = f"{out}/shards/{{{stems[0]}..{stems[-1]}}}.tar"
    features, shards = out / "features", out / "shards"
    atomic_write_text(features / "corpus.json", json.dumps({"pattern": pattern, "backbone": BACKBONE,
                                                             "parts": stems}, indent=2) + "\n")
    png = tiny_png()
    cfg = ExtractConfig()  # shard_size 2048, batch 128, float16, patches and tokens, fp32: extraction's defaults
    t0 = time.time()
    with DecompositionStore(out / "decompositions.sqlite") as store:
        sid = store.register(SETTINGS)
        for s, stem in enumerate(stems):
            part = features / "parts" / stem
            tar = shards / f"{stem}.tar"
            first = s * a.shard_images
            count = min(a.shard_images, a.images - first)
            if (part / "done.json").is_file() and tar.is_file():
                print(f"part {stem}: done already", flush=True)
                continue
            samples = part_samples(first, count, a.pairs, a.tokens)
            store.put_many(sid, [d for _, d in samples])
            if not tar.is_file():  # write_shards numbers from 00000: write into a scratch folder, move into place
                scratch = shards / f".part-{stem}"
                shutil.rmtree(scratch, ignore_errors=True)
                write_shards([(key, png, ".png", d.caption, {"key": key, "caption": d.caption, "width": 1,
                                                            "height": 1}) for key, d in samples],
                             scratch, shard_size=count)
                os.replace(scratch / "00000.tar", tar)
                scratch.rmdir()
            # the stand-in backbone's generator: one per part, so a resumed run writes what a whole run would
            seed = int.from_bytes(hashlib.sha256(f"{a.seed}/{stem}".encode()).digest()[:8], "little")
            backbone = RandomBackbone(a.dim, a.patches, seed)
            extract_images(backbone, [(key, _Image(f"{tar.name}#{key}")) for key, _ in samples], part, cfg)
            texts: dict[str, None] = {}  # in extract_corpus's order: each sample's pairs, local then context
            for _, d in samples:
                for pair in d.pairs:
                    texts[pair.local] = None
                    texts[pair.context] = None
            extract_texts(backbone, [(t, t) for t in texts], part, cfg)
            check_layout(part, count, len(texts), a.dim, a.patches)
            atomic_write_text(part / "done.json", json.dumps({"samples": count, "texts": len(texts)}) + "\n")
            del samples, texts
            print(f"part {stem}: {count} images, {a.pairs * 2 * count} texts "
                  f"({first + count}/{a.images} images, {time.time() - t0:.0f} s)", flush=True)
    if not record.is_file():
        atomic_write_text(record, json.dumps(args) + "\n")
        pending.unlink()
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"synthetic corpus of {a.images} images in {out} ({size / 2**20:.0f} MiB, {time.time() - t0:.0f} s)")
    print("train one epoch of stage 2 on it:")
    print(f"  foco train --in '{pattern}' --features {features} --decompositions {out}/decompositions.sqlite "
          f"--out {out}/train --stage1-epochs 0 --stage2-epochs 1 --batch-size 512 --max-negatives 31")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
