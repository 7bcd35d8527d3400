"""`foco world export`: a world benchmark written in each official layout, so that every reader can be run end to
end and compared with the world's own evaluation. docs/world.md ("Official-format exports") documents the mapping.

* cirr (world `single`): names = world gallery ids; images in dev/ (val) or test1/ (test); pairid = query index;
  img_set.members = the world subset; test files drop target_hard, target_soft and target_rank.
* circo (world `multi`): integer ids 1..N in gallery order, file names {id:012d}.png; gt_img_ids = the world
  targets, target_img_id = gt_img_ids[0]; shared_concept is empty; test files keep id, reference_img_id,
  relative_caption, shared_concept.
* fashioniq (world `single`): edit types map to categories (`FASHIONIQ_CATEGORIES`); every category's split file
  is the whole world gallery; captions = [the world modification, another phrasing of the same edit].
* genecis (world `single`): edit types map to tasks (`GENECIS_TASKS`); each query's gallery is its subset minus
  reference and target (the 4 hard negatives); attribute tasks get full-image boxes, so the dilated crop is the
  whole (square) image. GeneCIS has one split: the world split chosen is written with its targets.
"""
from __future__ import annotations

import filecmp
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..utils.io import ManifestError, atomic_write_text, read_jsonl
from ..utils.ownership import check_outputs, claim_folder, record_outputs
from ..world.edits import PHRASINGS, Edit, edit_text
from ..world.manifest import WorldBenchmark, load_benchmark
from ..world.scene import Scene

FORMATS = ("cirr", "circo", "fashioniq", "genecis")
FASHIONIQ_CATEGORIES = {"colour": "dress", "size": "dress", "replace": "shirt", "add": "shirt",
                        "remove": "toptee", "background": "toptee"}
GENECIS_TASKS = {"colour": "change_attribute", "size": "focus_attribute", "replace": "change_object",
                 "add": "change_object", "remove": "focus_object", "background": "focus_object"}


class _Plan:
    """What an export will write: JSON files and image copies, gathered before anything is written, so that the
    files it would replace can be checked first (`foco.utils.ownership`)."""

    def __init__(self):
        self.json: list[tuple[Path, Any]] = []
        self.images: list[tuple[Path, Path]] = []

    def write_json(self, path: Path, data: Any) -> None:
        self.json.append((path, data))

    def place(self, src: Path, dst: Path) -> None:
        self.images.append((src, dst))

    def check_images(self) -> None:
        """Refuses, before anything is written, an existing file under an image's name that holds other bytes."""
        for src, dst in self.images:
            if dst.exists() and not filecmp.cmp(src, dst, shallow=False):
                raise ManifestError(f"{dst} already exists and is another image than {src}: an export folder holds "
                                    "one split of one world; choose another --out")

    def run(self) -> None:
        for src, dst in self.images:
            _place(src, dst)
        for path, data in self.json:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def _place(src: Path, dst: Path) -> None:
    """Copies `src` to `dst` (a copy, not a link: editing the export never touches the world). An existing `dst`
    is kept only when it holds the same bytes; another image under that name is refused, never mixed in."""
    if dst.exists():
        if filecmp.cmp(src, dst, shallow=False):
            return
        raise ManifestError(f"{dst} already exists and is another image than {src}: an export folder holds one "
                            "split of one world; choose another --out")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def second_phrasing(scene: dict, edit: dict, modification: str) -> str:
    """Another instruction for the same edit (FashionIQ's second annotator), or the same one if none differs."""
    args = {k: v for k, v in edit.items() if k not in ("type", "index")}
    e, s = Edit(edit["type"], edit.get("index"), args), Scene.from_dict(scene)
    for p in range(len(PHRASINGS[e.type])):
        text = edit_text(s, e, p)
        if text != modification:
            return text
    return modification


def export_world(world: str | Path, fmt: str, split: str, out: str | Path, force: bool = False,
                 protocol: str | None = None) -> dict:
    """Writes the world's `split` benchmark to `out` in format `fmt`; returns a summary (also saved as
    `world_export.<fmt>.<split>.json` with the official query id -> world query id mapping).

    `protocol` defaults to the format's own (circo: multi, the others: single); `described` and `restaged` export in
    the cirr layout. `out` must be new, empty or an earlier export of the same protocol; an annotation file there that foco
    did not write is never replaced unless `force` (`foco.utils.ownership`)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    world, out = Path(world), Path(out)
    natural = "multi" if fmt == "circo" else "single"
    protocol = protocol or natural
    if protocol != natural and not (fmt == "cirr" and protocol in ("described", "restaged")):
        home = "--format circo" if protocol == "multi" else "--format cirr"
        raise ValueError(f"--format {fmt} exports the world's {natural} protocol, not {protocol} (--protocol "
                         f"{protocol} exports as {home})")
    if fmt == "circo":  # one gallery and one image-info file per folder, as in the official layout
        mine = f"world_export.circo.{split}.json"
        others = sorted(p.name for p in out.glob("world_export.circo.*.json") if p.name != mine)
        if others:
            raise ManifestError(f"{out} already holds a CIRCO export of another split ({', '.join(others)}): CIRCO's "
                                "splits share one gallery and one image-info file, and the world's splits have "
                                "different galleries, so each split needs its own --out")
    for earlier in sorted(out.glob(f"world_export.{fmt}.*.json")) if not force else []:
        try:  # one protocol per folder: val chooses slerp's alpha for test, so a mixed folder would mix them
            have = json.loads(earlier.read_text()).get("protocol", natural)
        except (OSError, ValueError, AttributeError):
            raise ManifestError(f"{earlier} is not a foco export record; choose another --out") from None
        if have != protocol:
            raise ManifestError(f"{out} holds a {fmt} export of the {have} protocol ({earlier.name}), not of "
                                f"{protocol}: choose another --out, or pass --force to write beside it")
    bench = load_benchmark(world, split, protocol)
    claim_folder(out, f"world export --format {fmt}", ("world_export.*.json",), force=force)
    writer = {"cirr": _cirr, "circo": _circo, "fashioniq": _fashioniq, "genecis": _genecis}[fmt]
    plan = _Plan()
    query_map, extra = writer(world, bench, split, out, plan)
    summary = {"world": str(world), "split": split, "protocol": protocol, "format": fmt,
               "queries": len(query_map), "gallery": len(bench.gallery_ids), **extra, "query_ids": query_map}
    plan.write_json(out / f"world_export.{fmt}.{split}.json", summary)
    check_outputs(out, [p for p, _ in plan.json], force)
    plan.check_images()
    record_outputs(out, [p for p, _ in plan.json] + [d for _, d in plan.images])  # before they are written: an
    plan.run()  # interrupted export is resumed, not refused as a user's files
    return summary


def _cirr(world: Path, b: WorldBenchmark, split: str, out: Path, plan: _Plan) -> tuple[dict, dict]:
    folder = "dev" if split == "val" else "test1"
    suffix = "val" if split == "val" else "test1"
    for g, src in zip(b.gallery_ids, b.gallery_images):
        plan.place(src, out / folder / f"{g}.png")
    entries = []
    for i, (ref, mod, targets, subset) in enumerate(zip(b.references, b.modifications, b.targets, b.subsets)):
        e: dict[str, Any] = {"pairid": i, "reference": ref, "caption": mod,
                             "img_set": {"id": i, "members": subset, "reference_rank": subset.index(ref)}}
        if split == "val":
            e["target_hard"] = targets[0]
            e["target_soft"] = {targets[0]: 1.0}
            e["img_set"]["target_rank"] = subset.index(targets[0])
        entries.append(e)
    plan.write_json(out / "captions" / f"cap.rc2.{suffix}.json", entries)
    plan.write_json(out / "image_splits" / f"split.rc2.{suffix}.json",
                {g: f"./{folder}/{g}.png" for g in b.gallery_ids})
    return {str(i): q for i, q in enumerate(b.query_ids)}, {}


def _circo(world: Path, b: WorldBenchmark, split: str, out: Path, plan: _Plan) -> tuple[dict, dict]:
    ids = {g: n for n, g in enumerate(b.gallery_ids, 1)}
    images = []
    for g, src in zip(b.gallery_ids, b.gallery_images):
        name = f"{ids[g]:012d}.png"
        plan.place(src, out / "COCO2017_unlabeled" / "unlabeled2017" / name)
        images.append({"id": ids[g], "file_name": name})
    plan.write_json(out / "COCO2017_unlabeled" / "annotations" / "image_info_unlabeled2017.json", {"images": images})
    entries = []
    for i, (ref, mod, targets) in enumerate(zip(b.references, b.modifications, b.targets)):
        e: dict[str, Any] = {"id": i, "reference_img_id": ids[ref], "relative_caption": mod, "shared_concept": ""}
        if split == "val":
            gt = [ids[t] for t in targets]
            e.update(target_img_id=gt[0], gt_img_ids=gt, semantic_aspects=[])
        entries.append(e)
    plan.write_json(out / "annotations" / f"{split}.json", entries)
    return {str(i): q for i, q in enumerate(b.query_ids)}, {"image_ids": {str(n): g for g, n in ids.items()}}


def _fashioniq(world: Path, b: WorldBenchmark, split: str, out: Path, plan: _Plan) -> tuple[dict, dict]:
    base = world / "benchmarks" / split / "single"
    scenes = {r["id"]: r["scene"] for r in read_jsonl(base / "gallery.jsonl")}
    edits = {r["id"]: r["edit"] for r in read_jsonl(base / "queries.jsonl")}
    for g, src in zip(b.gallery_ids, b.gallery_images):
        plan.place(src, out / "images" / f"{g}.png")
    per_cat: dict[str, list[dict]] = {c: [] for c in dict.fromkeys(FASHIONIQ_CATEGORIES.values())}
    query_map = {}
    for qid, ref, mod, targets, etype in zip(b.query_ids, b.references, b.modifications, b.targets, b.edit_types):
        cat = FASHIONIQ_CATEGORIES[etype]
        e: dict[str, Any] = {"candidate": ref, "captions": [mod, second_phrasing(scenes[ref], edits[qid], mod)]}
        if split == "val":
            e["target"] = targets[0]
        query_map[f"{cat}-{len(per_cat[cat])}"] = qid
        per_cat[cat].append(e)
    for cat, entries in per_cat.items():
        plan.write_json(out / "captions" / f"cap.{cat}.{split}.json", entries)
        plan.write_json(out / "image_splits" / f"split.{cat}.{split}.json", list(b.gallery_ids))
    return query_map, {"categories": FASHIONIQ_CATEGORIES}


def _genecis(world: Path, b: WorldBenchmark, split: str, out: Path, plan: _Plan) -> tuple[dict, dict]:
    from PIL import Image
    ids = {g: n for n, g in enumerate(b.gallery_ids, 1)}
    paths = dict(zip(b.gallery_ids, b.gallery_images))
    per_task: dict[str, list[dict]] = {t: [] for t in dict.fromkeys(GENECIS_TASKS.values())}
    query_map = {}

    def item(g: str, task: str) -> dict:
        if task.endswith("attribute"):
            plan.place(paths[g], out / "VG_100K_all" / f"{ids[g]}.png")
            with Image.open(paths[g]) as im:
                w, h = im.size
            return {"image_id": ids[g], "instance_bbox": [0, 0, w, h]}  # the whole image
        plan.place(paths[g], out / "val2017" / f"{ids[g]:012d}.png")
        return {"val_image_id": ids[g]}

    for qid, ref, mod, targets, subset, etype in zip(b.query_ids, b.references, b.modifications, b.targets,
                                                     b.subsets, b.edit_types):
        task = GENECIS_TASKS[etype]
        distractors = [m for m in subset if m not in (ref, targets[0])]
        query_map[f"{task}-{len(per_task[task])}"] = qid
        per_task[task].append({"reference": item(ref, task), "target": item(targets[0], task),
                               "gallery": [item(d, task) for d in distractors], "condition": mod})
    for task, entries in per_task.items():
        plan.write_json(out / "genecis" / f"{task}.json", entries)
    return query_map, {"tasks": GENECIS_TASKS}
