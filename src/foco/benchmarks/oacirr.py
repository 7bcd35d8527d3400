"""OACIRR (Yang et al., "Beyond Semantic Search: Towards Referential Anchoring in Composed Image Retrieval", CVPR
2026; the AdaFocal paper) read from its official layout, as the official code (github.com/HaHaJun1101/OACIR,
`data_utils.py`: OACIRR_VARIANT_CONFIGS, OACIRRDataset; `evaluate.py`: compute_oacirr_val_metrics,
compute_class_recall) reads it.

    ROOT/OACIRR-Subset/OACIRR-Fashion/                       IMG: image paths are relative to this folder
    ROOT/OACIRR-Subset/OACIRR-Fashion/oacirr-fashion/        ANN (also Car, Product, Landmark)
    ROOT/OACIRR-Union/oacirr-union/                          the joint training set (domain "union")
    ROOT/OACIRR-CrossDomain/WO-Fashion/oacirr-wo-fashion/    leave-one-out training sets ("wo-fashion", ...)
    ANN/quadruple_captions/caption_full.{train,val}.json     [{reference, target, modification_text_mllm,
                                                               object_category, reference_bounding_box,
                                                               (val, optional) target_subset_vitG}, ...]
    ANN/image_splits/split.{train,val}.json                  {image name: path relative to IMG}
    ANN/image_bounding_box/bounding_box.{train,val}.json     {image name: [x1, y1, x2, y2]}

Boxes are [x1, y1, x2, y2] in pixels of the original image (`transform_bbox_targetpad`). An image's instance is the
folder holding it: `path.split('/')[-2]` of its split path. Another domain name (e.g. the world's "shapes", written
by `foco.benchmarks.export_oacirr`) is read from ROOT/OACIRR-Subset/OACIRR-<Name>/oacirr-<name>/.

Protocol, per domain (one part each): the gallery is every image of the domain's split.val.json, in file order;
the reference is removed from each ranking; R@K: the target is in the top K; R_ID@K: a top-K image is in the
target's instance folder. evaluate.py prints R_ID@1/3/5 and R@1/5/10/50 per domain; the paper's table reports
R_ID@1, R@1, R@5 per domain and "Avg." over all of them (the mean of each domain's mean of the three).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from ..utils.io import ImageLoadError, ManifestError
from .annotations import check_each, check_known, check_texts, read_annotation, require
from .base import BenchmarkReader, CIRBenchmark, CIRQuery, EvalProtocol, ImageRef, ReaderOption

DOMAINS = ("fashion", "car", "product", "landmark")
SPLITS = ("train", "val")  # OACIRRDataset accepts no other split
FIELDS = ("reference", "target", "modification_text_mllm", "object_category", "reference_bounding_box")
PROTOCOL = EvalProtocol(remove_reference=True, recall_ks=(1, 5, 10, 50), instance_ks=(1, 3, 5),
                        average=("R_ID@1", "R@1", "R@5"), parts_averaged=True)
# data_utils.OACIRR_VARIANT_CONFIGS: domain -> (image folder, annotation folder), relative to ROOT
VARIANTS = {"union": ("OACIRR-Union", "OACIRR-Union/oacirr-union"),
            **{d: (f"OACIRR-Subset/OACIRR-{d.capitalize()}", f"OACIRR-Subset/OACIRR-{d.capitalize()}/oacirr-{d}")
               for d in DOMAINS},
            **{f"wo-{d}": (f"OACIRR-CrossDomain/WO-{d.capitalize()}",
                           f"OACIRR-CrossDomain/WO-{d.capitalize()}/oacirr-wo-{d}") for d in DOMAINS}}


def domain_dirs(domain: str) -> tuple[str, str]:
    """(image folder, annotation folder) of `domain` relative to ROOT: an official variant ("fashion", "union",
    "wo-car"; "WO_Car" as the official code spells it is accepted) or another subset ("shapes")."""
    key = domain.strip().lower().replace("_", "-")
    if key in VARIANTS:
        return VARIANTS[key]
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", key):
        raise ValueError(f"OACIRR domain {domain!r}: use one of {', '.join(VARIANTS)} or a subset name of letters, "
                         "digits and hyphens (read from OACIRR-Subset/OACIRR-<Name>/oacirr-<name>/)")
    cap = "-".join(p.capitalize() for p in key.split("-"))
    return f"OACIRR-Subset/OACIRR-{cap}", f"OACIRR-Subset/OACIRR-{cap}/oacirr-{key}"


def _root(root: Path) -> Path:
    """ROOT is the folder holding OACIRR-Subset / OACIRR-Union; its parent (holding OACIRR/) is accepted too."""
    if not any((root / d).is_dir() for d in ("OACIRR-Subset", "OACIRR-Union", "OACIRR-CrossDomain")) \
            and (root / "OACIRR").is_dir():
        return root / "OACIRR"
    return root


def _is_box(b) -> bool:
    return (isinstance(b, (list, tuple)) and len(b) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in b)
            and b[0] < b[2] and b[1] < b[3])


def image_size(path: Path) -> tuple[int, int]:
    """(W, H) from the image header (PIL opens lazily: no pixel is decoded)."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            return int(im.size[0]), int(im.size[1])
    except OSError as exc:
        raise ImageLoadError(f"cannot read the size of {path}: {exc}") from None


def read_oacirr(root: str | Path, split: str = "val", domains: tuple[str, ...] = DOMAINS) -> list[CIRBenchmark]:
    """One `CIRBenchmark` per domain ("oacirr/<domain>") of `split` (train or val). Each query carries `instance`
    (the target's instance folder), `box` (reference_bounding_box) and `box_size` (the reference's W, H);
    `instances` maps each gallery image to (its instance folder,). Problems raise ManifestError naming the file."""
    root = _root(Path(root))
    if split not in SPLITS:
        raise ValueError(f"OACIRR split must be train or val (the official code has no other), not {split!r}; "
                         "its val files are the evaluation benchmark")
    if isinstance(domains, str):
        domains = tuple(d for d in domains.split(",") if d.strip())
    if not domains:
        raise ValueError(f"no OACIRR domain given; choose from {', '.join(DOMAINS)}")
    return [_read_domain(root, split, d) for d in domains]


def _read_domain(root: Path, split: str, domain: str) -> CIRBenchmark:
    img_dir, ann_dir = (root / p for p in domain_dirs(domain))
    cap_path = ann_dir / "quadruple_captions" / f"caption_full.{split}.json"
    split_path = ann_dir / "image_splits" / f"split.{split}.json"
    box_path = ann_dir / "image_bounding_box" / f"bounding_box.{split}.json"
    entries = read_annotation(cap_path, list, f"OACIRR's quadruple_captions/caption_full.<split>.json of {domain}")
    names = read_annotation(split_path, dict, f"OACIRR's image_splits/split.<split>.json of {domain}")
    boxes = read_annotation(box_path, dict, f"OACIRR's image_bounding_box/bounding_box.<split>.json of {domain}")

    bad = [n for n, rel in names.items() if not (isinstance(rel, str) and len(rel.split("/")) >= 2
                                                 and rel.split("/")[-2] not in ("", ".", ".."))]
    if bad:
        raise ManifestError(f"{split_path}: {len(bad)} image path(s) are not 'INSTANCE_FOLDER/FILE' strings (the "
                            f"instance id is the parent folder of each path), e.g. {bad[:3]}; fix the file")
    del boxes  # OACIRRDataset opens it always but uses it only to draw or crop gallery boxes (baselines)

    require(cap_path, entries, FIELDS)
    check_each(cap_path, entries, lambda e: isinstance(e["reference"], str) and isinstance(e["target"], str),
               "a reference or target that is not one image name (string)")
    check_each(cap_path, entries, lambda e: isinstance(e["object_category"], str), "an object_category that is "
               "not a string")
    check_texts(cap_path, entries, lambda e: [e["modification_text_mllm"]], "modification_text_mllm")
    check_each(cap_path, entries, lambda e: _is_box(e["reference_bounding_box"]),
               "a reference_bounding_box that is not [x1, y1, x2, y2] with x1 < x2, y1 < y2")
    check_each(cap_path, entries, lambda e: e["reference"] != e["target"],
               "the target equal to the reference (removed from its own ranking, it could never be retrieved)")
    where = f"{split_path.name} ({len(names)} images)"
    check_known(cap_path, "reference images", (e["reference"] for e in entries), names, where)
    check_known(cap_path, "targets", (e["target"] for e in entries), names, where)

    folder = {n: rel.split("/")[-2] for n, rel in names.items()}
    images = {n: ImageRef(img_dir / rel) for n, rel in names.items()}
    refs = list(dict.fromkeys(e["reference"] for e in entries))
    missing = [r for r in refs if not images[r].path.is_file()]
    if missing:
        raise ImageLoadError(f"{len(missing)} reference image(s) of {cap_path} missing under {img_dir}, e.g. "
                             f"{', '.join(str(images[r].path) for r in missing[:3])}; unzip the images there")
    sizes = {r: image_size(images[r].path) for r in refs}
    queries = [CIRQuery(id=str(i), reference=e["reference"], texts=(e["modification_text_mllm"],),
                        targets=[e["target"]], category=e["object_category"], instance=folder[e["target"]],
                        box=tuple(float(v) for v in e["reference_bounding_box"]), box_size=sizes[e["reference"]])
               for i, e in enumerate(entries)]
    return CIRBenchmark(name=f"oacirr/{domain.strip().lower().replace('_', '-')}", split=split, images=images,
                        gallery=list(names), queries=queries, protocol=PROTOCOL, options={"domain": domain},
                        instances={n: (folder[n],) for n in names})


READER = BenchmarkReader(read_oacirr, (
    ReaderOption("domains", "--oacirr-domains", "OACIRR domains, comma-separated (fashion, car, product, landmark; "
                 "union, wo-<domain>; or a subset such as the world's shapes)", default=",".join(DOMAINS),
                 parse=lambda v: tuple(d.strip() for d in v.split(",") if d.strip())),
))
