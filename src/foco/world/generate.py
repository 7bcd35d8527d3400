"""Generates the embedded world on disk: images, caption pairs with decompositions, and CIR benchmarks.

Layout of a world folder (all paths in manifests are relative to it)::

    world.json                                   config, vocabulary, counts, and each manifest's sha256
    pairs/{pretrain,train,backbone_val}.jsonl    one image-caption pair per line
    benchmarks/{val,test}/{single,multi}/gallery.jsonl
    benchmarks/{val,test}/{single,multi}/queries.jsonl
    images/<part>/<id>.png                       64 x 64 RGB
    images.sha256                                every image's content hash (`sha256sum -c` reads it)

`pretrain` trains the backbone, `train` trains FoCo, `backbone_val` measures the backbone, `val` tunes and `test`
reports. No two splits share a rendered scene; `backbone_val` also shares no caption-level scene with `pretrain`.
Captions of `pretrain` and `train` may be partial (see `captions.py`); those of `backbone_val` name everything, so
that caption -> image retrieval there is well posed.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..utils.io import atomic_write_text, sha256_file
from ..utils.progress import progress
from .benchmark import Benchmark, build_benchmark
from .captions import CaptionChoice, caption_scene
from .render import render_scene
from .scene import Scene, Stamp, sample_scene
from .stamps import load_stamps
from .vocab import BACKGROUNDS, COLOURS, IMAGE_SIZE, MARK_PHRASES, MARKS, SHAPES, SIZES

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
PAIR_SPLITS = ("pretrain", "train", "backbone_val")
BENCH_SPLITS = ("val", "test")
PROTOCOLS = ("single", "multi")


@dataclass(frozen=True)
class WorldConfig:
    """How big a world to make. `size` names a preset; the counts can be overridden one by one."""

    seed: int = 0
    pretrain: int = 10000  # backbone-pretraining pairs
    train: int = 10000  # FoCo-training pairs
    backbone_val: int = 1000  # held-out pairs for backbone retrieval
    val_single: int = 300  # queries per benchmark and protocol
    val_multi: int = 150
    test_single: int = 1000
    test_multi: int = 400
    distractor_frac: float = 0.2  # random scenes added to each gallery, as a fraction of its query count
    stamps_dir: str | None = None  # folder of captioned cutouts (tuxpaint-stamps layout); None: shapes only
    stamp_prob: float = 0.3  # chance that an object is a stamp when stamps are given
    partial_captions: bool = True  # training captions may leave out objects or the background, as alt-text does
    # Issue 56: the share of the pretraining split's procedural shapes that carry an instance mark (`vocab.MARKS`,
    # drawn as OACIR draws them), and the share of pretraining captions that name the marks of the shapes they
    # mention. Both 0 (the presets): the pretraining split is what it always was. Only the pretraining split is
    # touched: its marks come from their own random stream, so the scenes, captions' other words and every other
    # split stay the same scene for scene.
    pretrain_marks: float = 0.0
    mark_captions: float = 0.0
    # (pretrain, train) counts drawn in the preset's order, interleaved with the other splits; set when a count was
    # changed (`world_config`): a larger split draws its extra pairs after every other split, a smaller one keeps
    # the first records, so that every other split (val, test, backbone_val) is the preset's, scene for scene.
    # None (the presets): every count is drawn in order, as before.
    base_counts: tuple[int, int] | None = None


SIZE_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(pretrain=600, train=600, backbone_val=200, val_single=40, val_multi=20, test_single=60,
                 test_multi=30),
    "default": {},
}


def world_config(size: str = "default", seed: int = 0, **overrides) -> WorldConfig:
    """A preset's config with `overrides`. Changing `pretrain` or `train` leaves every other split as the preset
    draws it (`WorldConfig.base_counts`): the data-scale curve compares training sets on one val and test."""
    if size not in SIZE_PRESETS:
        raise ValueError(f"unknown world size {size!r}; choose from {sorted(SIZE_PRESETS)}")
    preset = WorldConfig(seed=seed, **SIZE_PRESETS[size])
    cfg = replace(preset, **overrides)
    for split in ("pretrain", "train"):
        if getattr(cfg, split) < 1:
            raise ValueError(f"the {split} split needs at least 1 pair, got {getattr(cfg, split)} "
                             f"(--{split}-pairs)")
    for name, flag in (("pretrain_marks", "--pretrain-marks"), ("mark_captions", "--mark-captions")):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{flag} is a share from 0 to 1, got {getattr(cfg, name)}")
    if cfg.mark_captions > 0 and cfg.pretrain_marks == 0:
        raise ValueError(f"--mark-captions {cfg.mark_captions} names marks, but --pretrain-marks is 0, so no "
                         "pretraining shape carries one: give --pretrain-marks a share above 0")
    if (cfg.pretrain, cfg.train) != (preset.pretrain, preset.train) and cfg.base_counts is None:
        cfg = replace(cfg, base_counts=(preset.pretrain, preset.train))
    return cfg


def config_record(cfg: WorldConfig) -> dict:
    """The config as world.json records it (JSON values; `base_counts` only where set, so that a preset's record is
    what it was before the field existed)."""
    rec = json.loads(json.dumps(asdict(cfg)))
    if rec.get("base_counts") is None:
        rec.pop("base_counts", None)
    for key in ("pretrain_marks", "mark_captions"):  # recorded where set, so a world without marks records as before
        if not rec.get(key):
            rec.pop(key, None)
    return rec


def _split_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, sum(ord(c) * 31 ** i for i, c in enumerate(name)) % (2 ** 31)])


@dataclass(frozen=True)
class MarkRule:
    """Marks on a pairs split (issue 56): each procedural shape carries a mark with probability `marked`; a caption
    that mentions a marked shape becomes, with probability `named`, a detail caption: it names that one shape with
    its mark and nothing else ("a photo showing a small red star with a dot"), as a product's alt-text names the item
    and its logo. Every draw comes from `rng`, a stream of its own, so the split's scenes and the other splits are
    what they are without marks, and a caption that names no mark is the one it was."""

    rng: np.random.Generator
    marked: float
    named: float

    def apply(self, scene: Scene) -> Scene:
        objs = tuple(replace(o, mark=str(self.rng.choice(MARKS))) if o.stamp is None and self.rng.random() < self.marked
                     else o for o in scene.objects)
        return Scene(scene.background, objs)

    def detail(self, scene: Scene, choice: CaptionChoice) -> bool:
        """Whether the caption names a mark; if so, `choice` is narrowed to the first marked shape it mentions."""
        shown = [i for i in choice.order if scene.objects[i].mark is not None]
        if not shown or not self.rng.random() < self.named:
            return False
        choice.order, choice.bg_phrase = shown[:1], None
        return True


def _pair_records(rng: np.random.Generator, split: str, n: int, taken: set, forbidden_semantic: set,
                  unique_semantic: bool, stamps: list[Stamp], stamp_prob: float, partial: bool,
                  start: int = 0, marks: MarkRule | None = None) -> list[dict]:
    records, semantic_seen = [], set()
    while len(records) < n:
        scene = sample_scene(rng, stamps, stamp_prob)
        key, sem = scene.layout_key(), scene.semantic_key()
        if key in taken or sem in forbidden_semantic or (unique_semantic and sem in semantic_seen):
            continue
        taken.add(key)  # the unmarked scene's key: what the other splits are drawn against is as without marks
        semantic_seen.add(sem)
        choice = CaptionChoice(rng, scene, partial=partial)
        named = False
        if marks is not None:
            scene = marks.apply(scene)
            named = marks.detail(scene, choice)
        caption, decomposition, grounds = caption_scene(scene, choice, name_marks=named)
        pid = f"{split}-{start + len(records):06d}"
        records.append({"id": pid, "image": f"images/{split}/{pid}.png", "caption": caption,
                        "decomposition": decomposition.to_dict(), "grounding": grounds,
                        "scene": scene.to_dict()})
    return records


def _bench_records(bench: Benchmark, part: str) -> tuple[list[dict], list[dict]]:
    gallery = [{"id": g.id, "image": f"images/{part}/{g.id}.png", "scene": g.scene.to_dict()}
               for g in bench.gallery]
    queries = []
    for q in bench.queries:
        rec = {"id": q.id, "reference": q.reference, "modification": q.modification, "edit": q.edit.to_dict()}
        if bench.protocol == "single":
            rec.update(target=q.targets[0], subset=q.subset)
        else:
            rec.update(targets=q.targets)
        queries.append(rec)
    return gallery, queries


def world_fingerprint(root: str | Path) -> str | None:
    """What a world is, for the artifacts made from it: the sha256 of its world.json (config, counts and, since
    issue 24, every manifest's sha256). A feature cache records it; evaluation and training check it."""
    path = Path(root) / "world.json"
    if path.exists() and not path.is_file():
        from ..utils.io import ManifestError
        raise ManifestError(f"{path} is not a file: the world's record is damaged; regenerate the world")
    return sha256_file(path)[:16] if path.is_file() else None


def _dump_jsonl(path: Path, records: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def _marks(cfg: WorldConfig, stream: str) -> MarkRule | None:
    """The mark rule of a pairs split's stream ("pretrain", "pretrain/extra"); None where the split has no marks."""
    if not stream.startswith("pretrain") or cfg.pretrain_marks == 0:
        return None
    return MarkRule(_split_rng(cfg.seed, f"{stream}/marks"), cfg.pretrain_marks, cfg.mark_captions)


def mark_statistics(records: list[dict]) -> dict:
    """What a pairs split's marks are: the share of its procedural shapes that carry one, and the share of all its
    captions that are detail captions naming one (world.json records it for the pretraining split where marks are
    on; the config's `mark_captions` is the share of the captions that mention a marked shape)."""
    shapes = [o for r in records for o in r["scene"]["objects"] if o.get("stamp") is None]
    named = sum(any(f" with {MARK_PHRASES[o['mark']]}" in r["caption"] for o in r["scene"]["objects"] if o.get("mark"))
                for r in records)
    return {"shapes": len(shapes), "shapes_marked": round(sum("mark" in o for o in shapes) / max(1, len(shapes)), 4),
            "captions": len(records), "captions_naming_marks": round(named / max(1, len(records)), 4)}


def plan_world(cfg: WorldConfig) -> dict[str, list[dict]]:
    """All manifests of the world, as {relative manifest path: records}. Pure: no file is written."""
    stamps = load_stamps(cfg.stamps_dir) if cfg.stamps_dir else []
    taken: set = set()
    manifests: dict[str, list[dict]] = {}
    pretrain_semantic: set = set()
    base = dict(zip(("pretrain", "train"), cfg.base_counts)) if cfg.base_counts else {}
    for split in PAIR_SPLITS:
        rng = _split_rng(cfg.seed, split)
        recs = _pair_records(rng, split, base.get(split, getattr(cfg, split)), taken,
                             forbidden_semantic=pretrain_semantic if split == "backbone_val" else set(),
                             unique_semantic=split == "backbone_val", stamps=stamps, stamp_prob=cfg.stamp_prob,
                             partial=cfg.partial_captions and split != "backbone_val",
                             marks=_marks(cfg, split))
        if split == "pretrain":
            pretrain_semantic = {Scene.from_dict(r["scene"]).semantic_key() for r in recs}
        manifests[f"pairs/{split}.jsonl"] = recs
    for split in BENCH_SPLITS:
        for protocol in PROTOCOLS:
            n = getattr(cfg, f"{split}_{protocol}")
            rng = _split_rng(cfg.seed, f"{split}/{protocol}")
            bench = build_benchmark(rng, protocol, n, prefix=f"{split}-{protocol[0]}", taken=taken,
                                    n_distractors=int(round(cfg.distractor_frac * n)), stamps=stamps,
                                    stamp_prob=cfg.stamp_prob)
            gallery, queries = _bench_records(bench, f"{split}-{protocol}")
            manifests[f"benchmarks/{split}/{protocol}/gallery.jsonl"] = gallery
            manifests[f"benchmarks/{split}/{protocol}/queries.jsonl"] = queries
    for split, n in base.items():  # a changed count: cut, or extra pairs drawn after every other split
        want = getattr(cfg, split)
        recs = manifests[f"pairs/{split}.jsonl"]
        if want <= n:
            manifests[f"pairs/{split}.jsonl"] = recs[:want]
            continue
        held = {Scene.from_dict(r["scene"]).semantic_key() for r in manifests["pairs/backbone_val.jsonl"]}
        extra = _pair_records(_split_rng(cfg.seed, f"{split}/extra"), split, want - n, taken,
                              forbidden_semantic=held if split == "pretrain" else set(), unique_semantic=False,
                              stamps=stamps, stamp_prob=cfg.stamp_prob, partial=cfg.partial_captions, start=n,
                              marks=_marks(cfg, f"{split}/extra"))
        manifests[f"pairs/{split}.jsonl"] = recs + extra
    return manifests


def _render_job(args: tuple[str, dict, str | None]) -> None:
    path, scene, stamps_dir = args
    img = render_scene(Scene.from_dict(scene), stamps_dir)
    tmp = path + ".tmp"
    img.save(tmp, format="PNG")
    os.replace(tmp, path)


HASHES = "images.sha256"  # "<sha256>  <relative path>" per image, the format of sha256sum
IN_PROGRESS = ".generating.json"  # the config of a generation that has not finished yet


def _claim(out: Path, cfg: WorldConfig) -> None:
    """Records the config before the first image, so that an interrupted folder is only ever resumed with the same
    config: images on disk are kept on resume, and another seed or size would mix two worlds' scenes."""
    marker = out / IN_PROGRESS
    want = config_record(cfg)
    if marker.is_file():
        have = json.loads(marker.read_text())
        if have != want:
            diff = ", ".join(f"{k} {have.get(k)!r}" for k in sorted(set(want) | set(have))
                             if have.get(k) != want.get(k))
            raise FileExistsError(f"{out} holds an interrupted world generated with another config ({diff}): rerun "
                                  "with that config to finish it, or choose another --out")
        return
    if (out / "images").exists() and any((out / "images").iterdir()):
        raise FileExistsError(f"{out} already holds images but no record of the config that made them: remove it "
                              "or choose another --out")
    atomic_write_text(marker, json.dumps(want, indent=2) + "\n")


def generate_world(out: str | Path, cfg: WorldConfig, workers: int | None = None) -> dict:
    """Writes the world to `out` and returns its summary (the content of world.json).

    Resumable: images already on disk are kept, so an interrupted run picks up where it stopped; world.json is
    written last, so its presence means the world is complete.
    """
    out = Path(out)
    summary_path = out / "world.json"
    if summary_path.is_file():
        existing = json.loads(summary_path.read_text())
        if existing.get("config") == config_record(cfg):
            log.info("world in %s is complete; reusing it", out)
            return existing
        raise FileExistsError(f"{out} holds a world generated with another config; choose another --out")
    _claim(out, cfg)
    manifests = plan_world(cfg)
    jobs = []
    for name, recs in manifests.items():
        if name.endswith("queries.jsonl"):
            continue
        for r in recs:
            path = out / r["image"]
            if not path.exists():
                jobs.append((str(path), r["scene"], cfg.stamps_dir))
    for d in {Path(j[0]).parent for j in jobs}:
        d.mkdir(parents=True, exist_ok=True)
    workers = workers or min(2, os.cpu_count() or 1)
    if jobs:
        if workers > 1 and len(jobs) > 200:
            import multiprocessing as mp
            with mp.get_context("fork").Pool(workers) as pool:
                for _ in progress(pool.imap_unordered(_render_job, jobs, chunksize=64), total=len(jobs),
                                  desc="rendering world"):
                    pass
        else:
            for job in progress(jobs, desc="rendering world"):
                _render_job(job)
    for name, recs in manifests.items():
        _dump_jsonl(out / name, recs)
    image_paths = sorted({r["image"] for name, recs in manifests.items() if not name.endswith("queries.jsonl")
                          for r in recs})
    atomic_write_text(out / HASHES, "".join(f"{sha256_file(out / rel)}  {rel}\n"
                                            for rel in progress(image_paths, desc="hashing images")))
    summary = {
        "format_version": FORMAT_VERSION,
        "config": config_record(cfg),
        "image_size": IMAGE_SIZE,
        "vocabulary": {"shapes": list(SHAPES), "colours": list(COLOURS), "sizes": list(SIZES),
                       "backgrounds": list(BACKGROUNDS)},
        "counts": {name: len(recs) for name, recs in manifests.items()},
        "manifests_sha256": {name: sha256_file(out / name) for name in manifests},  # `foco world verify` checks
    }
    if cfg.pretrain_marks:
        summary["pretrain_marks"] = mark_statistics(manifests["pairs/pretrain.jsonl"])
    atomic_write_text(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    (out / IN_PROGRESS).unlink(missing_ok=True)  # world.json now records the config
    return summary


def start_plan(base: Path, images: Path, gallery: list[dict]) -> None:
    """Before a protocol's first image is rendered: keeps the images in `images` only when `base`/.plan names this
    gallery (a killed run resumes it); images drawn for another plan (another count, or a foco that recorded
    none) are removed, never kept under the new records. Then records the plan."""
    import hashlib
    plan = hashlib.sha256(json.dumps(gallery, sort_keys=True).encode()).hexdigest()
    if not ((base / ".plan").is_file() and (base / ".plan").read_text().strip() == plan):
        for old in sorted(images.rglob("*.png")):
            old.unlink()
    atomic_write_text(base / ".plan", plan + "\n")
