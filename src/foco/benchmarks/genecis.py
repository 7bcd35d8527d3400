"""GeneCIS (Vaze et al., CVPR 2023) read from its JSON annotation files (the .pkl twins are never opened).

    ROOT/genecis/{focus_attribute,change_attribute,focus_object,change_object}.json
        [{"reference": ITEM, "target": ITEM, "gallery": [ITEM, ...], "condition": str}, ...]
    object tasks:    ITEM = {"val_image_id": int}    -> COCO_DIR/{val_image_id:012d}.jpg   (default ROOT/val2017)
    attribute tasks: ITEM = {"image_id": int, "instance_bbox": [x, y, w, h]}
                                                   -> VG_DIR/{image_id}.jpg             (default ROOT/VG_100K_all)
    A .png is used where the .jpg is missing (world exports are PNG).

Attribute images are cropped as the official code does: the box dilated by 0.7 and padded to a black square
(`base.dilated_square_crop`). Each query ranks its own gallery [target] + gallery, the target at index 0; R@1/2/3.
As the official evaluation, only entries whose gallery length equals the modal length are kept (on ties the
shortest such length); the number left out is reported as `discarded`. Ties in score rank the target first.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ..utils.io import ManifestError
from .annotations import check_each, check_texts, read_annotation, require
from .base import BenchmarkReader, CIRBenchmark, CIRQuery, EvalProtocol, ImageRef, ReaderOption, resolve_image

TASKS = ("focus_attribute", "change_attribute", "focus_object", "change_object")
PROTOCOL = EvalProtocol(remove_reference=False, recall_ks=(1, 2, 3))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) or (isinstance(v, str) and v.isdigit())


def _object_item_ok(item: Any) -> bool:
    return isinstance(item, dict) and _is_int(item.get("val_image_id"))


def _attribute_item_ok(item: Any) -> bool:
    if not isinstance(item, dict) or not _is_int(item.get("image_id")):
        return False
    box = item.get("instance_bbox")
    return (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)
            and box[2] > 0 and box[3] > 0)


def modal_gallery_length(lengths: list[int]) -> int:
    """The most frequent gallery length; on a tie, the shortest of the most frequent."""
    counts = Counter(lengths)
    best = max(counts.values())
    return min(n for n, c in counts.items() if c == best)


def read_genecis(root: str | Path, split: str = "val", tasks: tuple[str, ...] = TASKS,
                 coco_dir: str | Path | None = None, vg_dir: str | Path | None = None) -> list[CIRBenchmark]:
    """`split` must be "val": GeneCIS has one evaluation split (its files carry no split name)."""
    root = Path(root)
    if split != "val":
        raise ValueError("GeneCIS has a single evaluation split; use split val")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown GeneCIS task(s) {unknown}; choose from {', '.join(TASKS)}")
    coco = Path(coco_dir) if coco_dir else root / "val2017"
    vg = Path(vg_dir) if vg_dir else root / "VG_100K_all"
    return [_read_task(root / "genecis" / f"{t}.json", t, coco, vg) for t in tasks]


def _read_task(path: Path, task: str, coco: Path, vg: Path) -> CIRBenchmark:
    entries = read_annotation(path, list, "GeneCIS's genecis/<task>.json")
    if not entries:
        raise ManifestError(f"{path}: no entries")
    require(path, entries, ["reference", "target", "gallery", "condition"])
    attribute = task.endswith("attribute")
    item_ok = _attribute_item_ok if attribute else _object_item_ok
    what = ("an item without an integer image_id and an [x, y, w, h] instance_bbox of positive size" if attribute
            else "an item without an integer val_image_id")
    check_each(path, entries, lambda e: isinstance(e["condition"], str) and isinstance(e["gallery"], list)
               and all(item_ok(i) for i in [e["reference"], e["target"], *e["gallery"]]), what)
    check_texts(path, entries, lambda e: [e["condition"]], "condition")

    modal = modal_gallery_length([len(e["gallery"]) for e in entries])
    kept = [(i, e) for i, e in enumerate(entries) if len(e["gallery"]) == modal]  # i: index in the file
    images: dict[str, ImageRef] = {}

    def image_id(item: dict) -> str:
        if attribute:
            box = tuple(float(v) for v in item["instance_bbox"])
            key = f"vg{int(item['image_id'])}@{','.join(f'{v:g}' for v in box)}"
            if key not in images:
                images[key] = ImageRef(resolve_image(vg, str(int(item["image_id"]))), box)  # type: ignore[arg-type]
        else:
            key = f"coco{int(item['val_image_id'])}"
            if key not in images:
                images[key] = ImageRef(resolve_image(coco, f"{int(item['val_image_id']):012d}"))
        return key

    queries = []
    for i, e in kept:
        target = image_id(e["target"])
        queries.append(CIRQuery(id=f"{task}-{i}", reference=image_id(e["reference"]), texts=(e["condition"],),
                                targets=[target], gallery=[target, *(image_id(g) for g in e["gallery"])],
                                category=task))
    return CIRBenchmark(name=f"genecis/{task}", split="val", images=images, gallery=[], queries=queries,
                        protocol=PROTOCOL, discarded=len(entries) - len(kept),
                        options={"gallery_length": modal + 1})


READER = BenchmarkReader(read_genecis, (
    ReaderOption("tasks", "--genecis-task", "all, or comma-separated of " + ", ".join(TASKS),
                 default="all", parse=lambda v: TASKS if v == "all" else tuple(v.split(","))),
    ReaderOption("coco_dir", "--genecis-coco", "GeneCIS object-task images (default ROOT/val2017)"),
    ReaderOption("vg_dir", "--genecis-vg", "GeneCIS attribute-task images (default ROOT/VG_100K_all)"),
))
