"""The world's OACIR protocol (`foco.world.oacir`) written in OACIRR's official layout (`foco.benchmarks.oacirr`),
so that `read_oacirr` and the official code's formulas can be run end to end on a world.

    OUT/OACIRR-Subset/OACIRR-Shapes/<instance folder>/<id>.png          the images of every exported split
    OUT/OACIRR-Subset/OACIRR-Shapes/oacirr-shapes/quadruple_captions/caption_full.{train,val}.json
    OUT/OACIRR-Subset/OACIRR-Shapes/oacirr-shapes/image_splits/split.{train,val}.json
    OUT/OACIRR-Subset/OACIRR-Shapes/oacirr-shapes/image_bounding_box/bounding_box.{train,val}.json
    OUT/world_export.oacirr.json                                        this summary (query and folder mapping)

"shapes" is the world's own domain (`oacir.DOMAIN`), not one of OACIRR's four. OACIRR has train and val files
only: the world's train goes to train, the world's TEST to val (the split numbers are reported on), and the
world's val (for choosing settings) to val of a second domain, OACIRR-Subset/OACIRR-Shapes-Val/oacirr-shapes-val/
(read it with `read_oacirr(OUT, "val", ("shapes-val",))`).

Mapping. A quadruple is a world query: reference, target, modification_text_mllm = the modification,
object_category = the anchored shape's kind, reference_bounding_box = the query's box (x0, y0, x1, y1 pixels of the
64 x 64 reference, as OACIRR's [x1, y1, x2, y2]); image names are the world gallery ids; no target_subset_vitG (its
members were chosen by a ViT-G model; nothing in the world stands for it). Query order is the world's.

Instance folders. OACIRR files each image under ONE instance folder; a world image can show several marked
instances. An image goes to the folder of the instance it was made for: a query's reference, target and context
distractors to the query's anchored instance; an instance distractor to the instance that replaced it (the anchored
kind and colour with another mark); any other image (random distractors, scenes of dropped queries) to the first
instance its scene shows. A folder name is the world instance id "kind/colour/mark" as "kind-colour-mark" (spaces
as "_"). So R_ID@K read from the export counts an image as showing only its folder's instance, where the world's
own R_ID@K (`foco.metrics.instance_recall_at_k`) counts every instance it shows: the two can differ.
bounding_box.<split>.json gives, per image, the box of its folder's instance.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..utils.io import ManifestError, read_jsonl
from ..utils.ownership import check_outputs, claim_folder, record_outputs
from ..world.ambiguous import object_box
from ..world.manifest import load_benchmark
from ..world.oacir import DOMAIN, PROTOCOL, RECORD, SPLITS, instance_id
from ..world.scene import Scene

# world split -> (OACIRR domain, file split): OACIRR has train and val files only
TARGETS = {"train": (DOMAIN, "train"), "test": (DOMAIN, "val"), "val": (f"{DOMAIN}-val", "val")}
SUMMARY = "world_export.oacirr.json"


def instance_folder(instance: str) -> str:
    """"circle/red/two dots" -> "circle-red-two_dots": one path component per world instance id."""
    return "-".join(part.replace(" ", "_") for part in instance.split("/"))


def export_oacirr(world: str | Path, out: str | Path, splits: tuple[str, ...] = SPLITS, force: bool = False
                  ) -> dict:
    """Writes the OACIR protocol of the world's `splits` to `out` in OACIRR's layout (module docstring) and returns
    the summary saved as `out`/world_export.oacirr.json: per split its domain, file split, counts and query ids
    (quadruple index -> world query id), and `instance_folders` (folder -> world instance id)."""
    from .export import _Plan
    from .oacirr import domain_dirs
    world, out = Path(world), Path(out)
    bad = [s for s in splits if s not in TARGETS]
    if bad or not splits:
        raise ValueError(f"splits {','.join(splits) or '(none)'}: choose from {', '.join(SPLITS)}")
    for s in splits:
        if not (world / "benchmarks" / s / PROTOCOL / RECORD).is_file():
            raise ManifestError(f"{world / 'benchmarks' / s / PROTOCOL} holds no OACIR protocol ({RECORD}); write "
                                f"it first with `foco world oacir --world {world} --splits {s}`")
    from ..world.splits import check_image_hashes
    for s in splits:  # every image against its oacir.json before one is copied (a swapped picture is refused)
        bench = load_benchmark(world, s, PROTOCOL)
        check_image_hashes(Path(world), list(bench.gallery_images), f"{s}/{PROTOCOL}")
    claim_folder(out, "world export --format oacirr", ("world_export.*.json",), force=force)
    plan = _Plan()
    folders: dict[str, str] = {}
    summary: dict[str, Any] = {"world": str(world), "protocol": PROTOCOL, "format": "oacirr", "domain": DOMAIN,
                               "splits": {}}
    for split in splits:
        domain, file_split = TARGETS[split]
        img_dir, ann_dir = (out / p for p in domain_dirs(domain))
        entries, names, boxes, query_ids = _split(world, split, folders)
        for g, (rel, src) in names.items():
            plan.place(src, img_dir / rel)
        plan.write_json(ann_dir / "quadruple_captions" / f"caption_full.{file_split}.json", entries)
        plan.write_json(ann_dir / "image_splits" / f"split.{file_split}.json",
                        {g: rel for g, (rel, _) in names.items()})
        plan.write_json(ann_dir / "image_bounding_box" / f"bounding_box.{file_split}.json", boxes)
        summary["splits"][split] = {"domain": domain, "file_split": file_split, "queries": len(entries),
                                    "gallery": len(names), "query_ids": query_ids}
    summary["instance_folders"] = dict(sorted(folders.items()))
    plan.write_json(out / SUMMARY, summary)
    check_outputs(out, [p for p, _ in plan.json], force)
    plan.check_images()
    record_outputs(out, [p for p, _ in plan.json] + [d for _, d in plan.images])  # before they are written: an
    plan.run()  # interrupted export is resumed, not refused as a user's files
    return summary


def _split(world: Path, split: str, folders: dict[str, str]) -> tuple[list[dict], dict, dict, dict]:
    """(quadruples, {id: (relative path, source file)}, {id: box}, {index: world query id}) of one split."""
    bench = load_benchmark(world, split, PROTOCOL)  # checks the files against oacir.json
    base = world / "benchmarks" / split / PROTOCOL
    gallery = {str(g["id"]): g for g in read_jsonl(base / "gallery.jsonl", required=("id", "scene", "instances"))}
    queries = read_jsonl(base / "queries.jsonl", required=("id", "box", "instance", "instance_distractors",
                                                           "context_distractors"))
    made_for: dict[str, str] = {}  # gallery id -> the instance it was made for

    def assign(g: str, inst: str, qid: str) -> None:
        if made_for.setdefault(g, inst) != inst:
            raise ManifestError(f"{base / 'queries.jsonl'}: image {g} was made for {made_for[g]} and, by query "
                                f"{qid}, for {inst}; an OACIRR image belongs to one instance folder")

    for q in queries:
        inst = q["instance"]
        for g in (q["reference"], q["target"], *q["context_distractors"]):
            assign(g, inst, q["id"])
        kind_colour = inst.rsplit("/", 1)[0] + "/"
        for g in q["instance_distractors"]:
            other = [i for i in gallery[g]["instances"] if i.startswith(kind_colour) and i != inst]
            if not other:
                raise ManifestError(f"{base / 'gallery.jsonl'}: instance distractor {g} of query {q['id']} shows no "
                                    f"other instance of {kind_colour[:-1]}")
            assign(g, other[0], q["id"])
    names, boxes = {}, {}
    for g, src in zip(bench.gallery_ids, bench.gallery_images):
        inst = made_for.get(g) or next(iter(gallery[g]["instances"]), None)
        if inst is None:
            raise ManifestError(f"{base / 'gallery.jsonl'}: image {g} shows no marked instance, so it has no OACIRR "
                                "instance folder; regenerate the protocol with `foco world oacir`")
        folder = instance_folder(inst)
        if folders.setdefault(folder, inst) != inst:
            raise ManifestError(f"instances {folders[folder]} and {inst} share the folder name {folder}")
        scene = Scene.from_dict(gallery[g]["scene"])
        obj = next(o for o in scene.objects if o.mark is not None and instance_id(o) == inst)
        names[g] = (f"{folder}/{g}.png", src)
        boxes[g] = object_box(obj)
    entries = []
    for q, ref, mod, target in zip(queries, bench.references, bench.modifications, bench.targets):
        entries.append({"reference": ref, "target": target[0], "modification_text_mllm": mod,
                        "object_category": q["instance"].split("/")[0], "reference_bounding_box": list(q["box"])})
    return entries, names, boxes, {str(i): q["id"] for i, q in enumerate(queries)}
