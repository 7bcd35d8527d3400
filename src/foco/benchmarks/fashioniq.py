"""FashionIQ (Wu et al., CVPR 2021) read from its official layout, "original split" protocol.

    ROOT/captions/cap.{dress,shirt,toptee}.{val,test}.json    [{"candidate", "target", "captions": [c1, c2]}, ...]
    ROOT/image_splits/split.{dress,shirt,toptee}.{val,test}.json    [ASIN, ...]: the category's gallery
    ROOT/images/<ASIN>.png (or .jpg)

One benchmark part per category; gallery = the whole category split, the reference NOT removed; R@10 and R@50 per
category, and their mean over the categories. Each caption is stripped of surrounding spaces and ".,?" before
joining. How the two captions become query text is an explicit option (methods differ):

* "both" (SEARLE, LinCIR): "{c1} and {c2}" and "{c2} and {c1}", each composed with the reference; the final query is
  normalize(normalize(q1) + normalize(q2)).
* "single" (CIReVL): "{c1} and {c2}".
* "pic2word" (Pic2Word's order): "{c2} and {c1}".
"""
from __future__ import annotations

from pathlib import Path

from ..utils.io import ManifestError
from .annotations import check_each, check_known, check_texts, check_unique, read_annotation, require
from .base import BenchmarkReader, CIRBenchmark, CIRQuery, EvalProtocol, ImageRef, ReaderOption, resolve_image

CATEGORIES = ("dress", "shirt", "toptee")
JOINS = ("both", "single", "pic2word")
PROTOCOL = EvalProtocol(remove_reference=False, recall_ks=(10, 50))


def join_captions(c1: str, c2: str, join: str = "both") -> tuple[str, ...]:
    """The query text variant(s) of one FashionIQ caption pair. An empty caption is left out rather than joined
    ("a and " is no instruction); a pair of two empty captions is refused by the reader."""
    a, b = c1.strip().strip(".,? "), c2.strip().strip(".,? ")
    if not a or not b:
        if join not in JOINS:
            raise ValueError(f"unknown FashionIQ caption join {join!r}; choose from {', '.join(JOINS)}")
        if not (a or b):
            raise ValueError("both captions are empty")
        return (a or b,)
    if join == "both":
        return (f"{a} and {b}", f"{b} and {a}")
    if join == "single":
        return (f"{a} and {b}",)
    if join == "pic2word":
        return (f"{b} and {a}",)
    raise ValueError(f"unknown FashionIQ caption join {join!r}; choose from {', '.join(JOINS)}")


def _captions_ok(e: dict) -> bool:
    c = e["captions"]
    return isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c) and \
        any(x.strip().strip(".,? ") for x in c)


def read_fashioniq(root: str | Path, split: str = "val", join: str = "both",
                   categories: tuple[str, ...] = CATEGORIES) -> list[CIRBenchmark]:
    root = Path(root)
    if split not in ("val", "test"):
        raise ValueError(f"FashionIQ split must be val or test, not {split!r}")
    if join not in JOINS:
        raise ValueError(f"unknown FashionIQ caption join {join!r}; choose from {', '.join(JOINS)}")
    return [_read_category(root, split, join, cat) for cat in categories]


def _read_category(root: Path, split: str, join: str, cat: str) -> CIRBenchmark:
    cap_path = root / "captions" / f"cap.{cat}.{split}.json"
    split_path = root / "image_splits" / f"split.{cat}.{split}.json"
    entries = read_annotation(cap_path, list, "FashionIQ's captions/cap.<category>.<split>.json")
    gallery = read_annotation(split_path, list, "FashionIQ's image_splits/split.<category>.<split>.json")
    if not all(isinstance(a, str) for a in gallery):
        raise ManifestError(f"{split_path}: expected a list of image names (strings)")
    check_unique(split_path, "image names", gallery)
    with_target = split == "val"
    require(cap_path, entries, ["candidate", "captions"] + ["target"] * with_target)
    check_each(cap_path, entries, _captions_ok, "captions that are not a list of two strings, at least one not empty")
    check_texts(cap_path, entries, lambda e: e["captions"], "captions", allow_empty=True)
    check_each(cap_path, entries, lambda e: all(isinstance(e.get(k, ""), str) for k in ("candidate", "target")),
               "a candidate or target that is not an image name (string)")
    if with_target:
        check_known(cap_path, "targets", (e["target"] for e in entries), set(gallery),
                    f"{split_path.name} ({len(gallery)} images)")
    names = list(dict.fromkeys([*gallery, *(e["candidate"] for e in entries)]))
    images = {n: ImageRef(resolve_image(root / "images", n, (".png", ".jpg"))) for n in names}
    queries = [CIRQuery(id=f"{cat}-{i}", reference=e["candidate"], texts=join_captions(*e["captions"], join=join),
                        targets=[e["target"]] if with_target else [], category=cat)
               for i, e in enumerate(entries)]
    return CIRBenchmark(name=f"fashioniq/{cat}", split=split, images=images, gallery=list(gallery),
                        queries=queries, protocol=PROTOCOL, options={"join": join})


READER = BenchmarkReader(read_fashioniq, (
    ReaderOption("join", "--fashioniq-join", "how FashionIQ's two captions become query text", default="both",
                 choices=JOINS),
))
