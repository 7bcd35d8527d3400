"""CIRCO (Baldrati et al., ICCV 2023) read from its official layout.

    ROOT/annotations/{val,test}.json
    ROOT/COCO2017_unlabeled/annotations/image_info_unlabeled2017.json    {"images": [{"id", "file_name"}, ...]}
    ROOT/COCO2017_unlabeled/unlabeled2017/<file_name>                   the gallery (~123K images)

Protocol: mAP@5/10/25/50 with the official formula (`foco.metrics.map_at_k`) over the whole gallery, the reference
NOT removed; the ground truth is `gt_img_ids`. The query text is `relative_caption` only (adding `shared_concept`
is a known source of inflated numbers). Test entries have no ground truth: the rankings go to a submission file.
"""
from __future__ import annotations

from pathlib import Path

from ..utils.io import ManifestError
from .annotations import check_each, check_known, check_texts, check_unique, read_annotation, require
from .base import BenchmarkReader, CIRBenchmark, CIRQuery, EvalProtocol, ImageRef

PROTOCOL = EvalProtocol(remove_reference=False, map_ks=(5, 10, 25, 50), submission="circo")
GALLERY_INFO = Path("COCO2017_unlabeled") / "annotations" / "image_info_unlabeled2017.json"
GALLERY_DIR = Path("COCO2017_unlabeled") / "unlabeled2017"


def read_circo(root: str | Path, split: str = "val") -> list[CIRBenchmark]:
    root = Path(root)
    if split not in ("val", "test"):
        raise ValueError(f"CIRCO split must be val or test, not {split!r}")
    ann_path = root / "annotations" / f"{split}.json"
    info_path = root / GALLERY_INFO
    entries = read_annotation(ann_path, list, "CIRCO's annotations/<split>.json")
    info = read_annotation(info_path, dict, "the COCO 2017 unlabeled image list")
    if not isinstance(info.get("images"), list):
        raise ManifestError(f"{info_path}: expected an 'images' list of {{id, file_name}}")
    require(info_path, info["images"], ["id", "file_name"], id_key="id")
    check_each(info_path, info["images"], lambda im: isinstance(im["file_name"], str) and im["file_name"].strip(),
               "a file_name that is not a file name (string)", "id")
    gallery = [str(im["id"]) for im in info["images"]]
    check_unique(info_path, "image ids", gallery)
    images = {str(im["id"]): ImageRef(root / GALLERY_DIR / im["file_name"]) for im in info["images"]}

    with_target = split == "val"
    require(ann_path, entries, ["id", "reference_img_id", "relative_caption"] + ["gt_img_ids"] * with_target,
            id_key="id")
    check_each(ann_path, entries, lambda e: isinstance(e["relative_caption"], str),
               "a relative_caption that is not a string", "id")
    check_texts(ann_path, entries, lambda e: [e["relative_caption"]], "relative_caption", "id")
    if with_target:
        check_each(ann_path, entries, lambda e: isinstance(e["gt_img_ids"], list) and len(e["gt_img_ids"]) > 0,
                   "an empty or non-list gt_img_ids", "id")
    check_unique(ann_path, "query ids", [str(e["id"]) for e in entries])
    where = f"{info_path.name} ({len(gallery)} images)"
    check_known(ann_path, "reference images", (str(e["reference_img_id"]) for e in entries), images, where)
    if with_target:
        check_known(ann_path, "ground-truth images", (str(g) for e in entries for g in e["gt_img_ids"]), images,
                    where)
    queries = [CIRQuery(id=str(e["id"]), reference=str(e["reference_img_id"]), texts=(e["relative_caption"],),
                        targets=[str(g) for g in e["gt_img_ids"]] if with_target else []) for e in entries]
    return [CIRBenchmark(name="circo", split=split, images=images, gallery=gallery, queries=queries,
                         protocol=PROTOCOL)]


READER = BenchmarkReader(read_circo)
