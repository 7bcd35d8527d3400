"""CIRR (Liu et al., ICCV 2021) read from its official layout.

    ROOT/captions/cap.rc2.{val,test1}.json          (ROOT/cirr/captions/ is accepted too)
    ROOT/image_splits/split.rc2.{val,test1}.json    {name: path relative to ROOT, e.g. "./dev/dev-0-0-img0.png"}
    ROOT/dev/..., ROOT/test1/...                    the images the split files point to

Protocol: R@1/5/10/50 over the whole split gallery with the reference removed from each ranking (hit = name ==
target_hard); Recall_subset@1/2/3 over img_set.members minus the reference. Test entries have no target: the
rankings go to the two submission files instead.
"""
from __future__ import annotations

from pathlib import Path

from ..utils.io import ManifestError
from .annotations import check_each, check_known, check_texts, check_unique, read_annotation, require
from .base import BenchmarkReader, CIRBenchmark, CIRQuery, EvalProtocol, ImageRef

FILE_SPLITS = {"val": "val", "test": "test1"}  # our split name -> CIRR's file suffix
PROTOCOL = EvalProtocol(remove_reference=True, recall_ks=(1, 5, 10, 50), subset_ks=(1, 2, 3), submission="cirr")


def _annotation_dir(root: Path, name: str) -> Path:
    for base in (root, root / "cirr"):
        if (base / name).is_dir():
            return base / name
    return root / name


def read_cirr(root: str | Path, split: str = "val") -> list[CIRBenchmark]:
    root = Path(root)
    if split not in FILE_SPLITS:
        raise ValueError(f"CIRR split must be one of {sorted(FILE_SPLITS)}, not {split!r}")
    suffix = FILE_SPLITS[split]
    cap_path = _annotation_dir(root, "captions") / f"cap.rc2.{suffix}.json"
    split_path = _annotation_dir(root, "image_splits") / f"split.rc2.{suffix}.json"
    entries = read_annotation(cap_path, list, "CIRR's captions/cap.rc2.<split>.json")
    names = read_annotation(split_path, dict, "CIRR's image_splits/split.rc2.<split>.json")
    bad_paths = [n for n, rel in names.items() if not isinstance(rel, str)]
    if bad_paths:
        raise ManifestError(f"{split_path}: {len(bad_paths)} image path(s) are not strings, e.g. {bad_paths[:3]}")

    with_target = split == "val"
    require(cap_path, entries, ["pairid", "reference", "caption", "img_set"] + (["target_hard"] * with_target),
            id_key="pairid")
    check_each(cap_path, entries, lambda e: isinstance(e["caption"], str), "a caption that is not a string",
               "pairid")
    check_texts(cap_path, entries, lambda e: [e["caption"]], "caption", "pairid")
    check_each(cap_path, entries, lambda e: isinstance(e["img_set"], dict)
               and isinstance(e["img_set"].get("members"), list) and e["reference"] in e["img_set"]["members"],
               "an img_set without a members list holding the reference", "pairid")
    check_each(cap_path, entries, lambda e: isinstance(e["reference"], str)
               and (not with_target or isinstance(e["target_hard"], str)),
               "a reference or target_hard that is not one image name (string)", "pairid")
    check_unique(cap_path, "pairids", [str(e["pairid"]) for e in entries])
    where = f"{split_path.name} ({len(names)} images)"
    check_known(cap_path, "reference images", (e["reference"] for e in entries), names, where)
    check_known(cap_path, "subset members", (m for e in entries for m in e["img_set"]["members"]), names, where)
    if with_target:
        check_known(cap_path, "targets", (e["target_hard"] for e in entries), names, where)

    queries = [CIRQuery(id=str(e["pairid"]), reference=e["reference"], texts=(e["caption"],),
                        targets=[e["target_hard"]] if with_target else [],
                        subset=list(e["img_set"]["members"])) for e in entries]
    return [CIRBenchmark(name="cirr", split=split, images={n: ImageRef(root / rel) for n, rel in names.items()},
                         gallery=list(names), queries=queries, protocol=PROTOCOL)]


READER = BenchmarkReader(read_cirr)
