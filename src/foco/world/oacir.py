"""The "oacir" world protocol: Object-Anchored Composed Image Retrieval (OACIR, the AdaFocal paper) in the world.

In OACIR a query is a reference image, a bounding box on one object of it, and a text that changes the object's
context; the box says: keep *this* instance. Here every object of an OACIR scene is a procedural shape with an
instance mark (`vocab.MARKS`, drawn by `render.py`; its texts and FoCo's captions never name marks, only the
pretraining split's detail captions may: `WorldConfig.mark_captions`). One domain: "shapes".

Instances. An instance id is "<kind>/<colour>/<mark>" (e.g. "circle/red/ring"): size is not part of it, so that an
instance stays itself under the "size" modification. Two objects of one kind, colour and size that differ in their
mark are two instances of the same semantics.

A query. The reference holds the anchored instance A, its "twin" (same kind, colour and size, another mark) and 0-1
other marked shapes of other kinds; the query's `box` (x0, y0, x1, y1, in pixels of the 64 x 64 reference,
`ambiguous.object_box`) surrounds A. The modification keeps A and changes its context, one of

* "background": another background ("put it on a beach", "place the red circle in the snow");
* "add": a companion of another kind appears ("add a green star next to it");
* "remove": the companion of another kind is removed (only where there is one);
* "move": A moves to another cell ("move it to the top left");
* "size": A becomes small or large ("make it bigger").

The text names A by "it" or "the <colour> <kind>", which fits the twin as well: only the box tells them apart. The
target drops the twin and shows A in the modified context.

Subset and gallery. Each query's subset is its reference (first, as in `single`), the target, 3 instance
distractors (the target with A's mark replaced by another: the twin's mark first) and 2-3 context distractors (A in
a wrong context: the reference without the twin, and the reference without the twin under another modification,
or under the same one with another value); the rest of the subset is shuffled. A split's gallery is every such
scene plus random marked-shape scenes (`distractor_frac` of the queries). A query is dropped when another gallery
scene shows what its target shows (the same background and the same instances at the same sizes; for "move", also
A in the same cell), so the ground truth is exact. Layouts are unique within a split; the splits are disjoint from
each other (test is drawn first, then val excluding test, then train excluding both: test depends on test's count
alone) and no scene of the world's own files is reused.

Files, per split (train, val, test; the world's own files are not touched)::

    benchmarks/<split>/oacir/gallery.jsonl   id, image, scene (with marks), instances (instance ids it shows)
    benchmarks/<split>/oacir/queries.jsonl   `single`'s fields (id, reference, modification, target, subset, edit;
                                             the edit's index is the anchored instance's in the reference)
                                             and box, instance, twin (the twin's instance id),
                                             instance_distractors, context_distractors (gallery ids)
    benchmarks/<split>/oacir/images/<id>.png
    benchmarks/<split>/oacir/oacir.json      seed, counts, box_format, image_size, marks, domain and the sha256 of
                                             the two jsonl files

`load_benchmark(root, split, "oacir")` reads it like `single` (and checks oacir.json); `load_oacir` gives the boxes
and instance ids, `oacir_statistics` what the gallery holds per query. Same world, same counts: byte-identical files.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..utils.io import ManifestError, atomic_write_text, read_json, read_jsonl, sha256_file
from ..utils.progress import progress
from .ambiguous import object_box
from .benchmark import GalleryItem
from .edits import Edit
from .generate import _dump_jsonl, _render_job, _split_rng, start_plan, world_fingerprint
from .manifest import OACIR, OACIR_FILES, OACIR_RECORD, check_oacir, load_benchmark, record_digest
from .scene import MAX_JITTER, Scene, WorldObject, sample_scene
from .vocab import BACKGROUNDS, COLOURS, GRID, IMAGE_SIZE, MARKS, SHAPES, SIZE_COMPARATIVE, SIZES

PROTOCOL = OACIR
RECORD = OACIR_RECORD
FILES = OACIR_FILES
SPLITS = ("train", "val", "test")
PLAN_ORDER = ("test", "val", "train")  # each split excludes the layouts of those before it
DOMAIN = "shapes"
FORMAT = 1
EDIT_TYPES = ("background", "add", "remove", "move", "size")
N_INSTANCE_DISTRACTORS = 3
TRAIN_FACTOR = 4  # train's default query count: this times the world's test_single
CELL_NAMES = ("top left", "top right", "bottom left", "bottom right")
assert len(CELL_NAMES) == GRID * GRID
PHRASINGS: dict[str, tuple[str, ...]] = {
    "background": ("put {it} {phrase}", "place {it} {phrase}", "show {it} {phrase}", "move {it} to {noun}"),
    "add": ("add {obj} next to {it}", "put {obj} beside {it}", "place {obj} near {it}"),
    "remove": ("remove the {other} next to {it}", "keep {it} but take away the {other}",
               "get rid of the {other} beside {it}"),
    "move": ("move {it} to the {where}", "put {it} in the {where}", "shift {it} to the {where}"),
    "size": ("make {it} {comparative}", "{verb} {it}"),
}
_SIZE_VERB = {"large": "enlarge", "small": "shrink"}


def instance_id(obj: WorldObject) -> str:
    """"circle/red/ring": kind, colour and mark (size is left out: an instance keeps its id when it grows)."""
    return f"{obj.kind}/{obj.colour}/{obj.mark}"


def scene_instances(scene: Scene) -> list[str]:
    """The instance ids of the marked objects of `scene`, in its object order."""
    return [instance_id(o) for o in scene.objects if o.mark is not None]


def _jitter(rng: np.random.Generator) -> tuple[int, int]:
    return (int(rng.integers(-MAX_JITTER, MAX_JITTER + 1)), int(rng.integers(-MAX_JITTER, MAX_JITTER + 1)))


def _marked(rng: np.random.Generator, cell: int, exclude_kinds: set) -> WorldObject:
    kind = str(rng.choice([k for k in SHAPES if k not in exclude_kinds]))
    return WorldObject(kind, str(rng.choice(list(COLOURS))), str(rng.choice(list(SIZES))), cell, _jitter(rng),
                       mark=str(rng.choice(MARKS)))


def _scene(background: str, objs) -> Scene:
    return Scene(background, tuple(sorted(objs, key=lambda o: o.cell)))


def sample_reference(rng: np.random.Generator) -> tuple[Scene, WorldObject, WorldObject]:
    """(reference, anchored instance, twin): the two share kind, colour and size and differ in their mark; 0-1
    other marked shape of another kind."""
    cells = [int(c) for c in rng.permutation(GRID * GRID)]
    anchor = _marked(rng, cells[0], set())
    twin = replace(anchor, cell=cells[1], jitter=_jitter(rng),
                   mark=str(rng.choice([m for m in MARKS if m != anchor.mark])))
    objs = [anchor, twin]
    if rng.random() < 0.5:
        objs.append(_marked(rng, cells[2], {anchor.kind}))
    return _scene(str(rng.choice(list(BACKGROUNDS))), objs), anchor, twin


def _other(scene: Scene, anchor: WorldObject) -> WorldObject | None:
    """The object of another kind than the anchor's, if any."""
    return next((o for o in scene.objects if o.kind != anchor.kind), None)


def applicable(ref: Scene, anchor: WorldObject) -> list[str]:
    return [t for t in EDIT_TYPES if t != "remove" or _other(ref, anchor) is not None]


def sample_context_edit(rng: np.random.Generator, base: Scene, anchor: WorldObject, edit_type: str,
                        exclude: dict | None = None) -> Edit:
    """A context edit of `base` (the reference without the twin) keeping `anchor`; `exclude`: argument values
    not to draw again (another value of the same edit)."""
    exclude = exclude or {}
    index = base.objects.index(anchor)
    if edit_type == "background":
        return Edit("background", index, {"background": str(rng.choice(
            [b for b in BACKGROUNDS if b not in (base.background, exclude.get("background"))]))})
    if edit_type == "add":
        used = {o.kind for o in base.objects}
        kinds = [k for k in SHAPES if k not in used and k != exclude.get("kind")]
        cell = int(rng.choice(base.free_cells()))
        return Edit("add", index, {"kind": str(rng.choice(kinds)), "colour": str(rng.choice(list(COLOURS))),
                                   "size": str(rng.choice(list(SIZES))), "mark": str(rng.choice(MARKS)),
                                   "cell": cell, "jitter": list(_jitter(rng))})
    if edit_type == "remove":
        other = _other(base, anchor)
        return Edit("remove", index, {"kind": other.kind, "colour": other.colour})
    if edit_type == "move":
        cells = [c for c in base.free_cells() if c != exclude.get("cell")]
        return Edit("move", index, {"cell": int(rng.choice(cells)), "jitter": list(_jitter(rng))})
    if edit_type == "size":
        return Edit("size", index, {"size": next(s for s in SIZES if s != anchor.size)})
    raise ValueError(f"unknown OACIR edit type {edit_type!r}; choose from {', '.join(EDIT_TYPES)}")


def apply_context_edit(base: Scene, edit: Edit) -> Scene:
    """`base` after `edit`; the anchored instance is `base.objects[edit.index]`."""
    a, anchor = edit.args, base.objects[edit.index]
    if edit.type == "background":
        return Scene(a["background"], base.objects)
    if edit.type == "add":
        new = WorldObject(a["kind"], a["colour"], a["size"], int(a["cell"]), tuple(a["jitter"]), mark=a["mark"])
        return _scene(base.background, [*base.objects, new])
    if edit.type == "remove":
        return _scene(base.background, [o for o in base.objects if o is anchor or o.kind != a["kind"]])
    if edit.type == "move":
        moved = replace(anchor, cell=int(a["cell"]), jitter=tuple(a["jitter"]))
        return _scene(base.background, [moved if o is anchor else o for o in base.objects])
    if edit.type == "size":
        return base.with_object(edit.index, size=a["size"])
    raise ValueError(f"unknown OACIR edit type {edit.type!r}")


def context_text(anchor: WorldObject, edit: Edit, phrasing: int, named: bool) -> str:
    """The instruction: it names the anchored instance by "it" or "the <colour> <kind>" (never its mark)."""
    a = edit.args
    template = PHRASINGS[edit.type][phrasing % len(PHRASINGS[edit.type])]
    it = f"the {anchor.colour} {anchor.kind}" if named else "it"
    if edit.type == "background":
        bg = BACKGROUNDS[a["background"]]
        return template.format(it=it, phrase=bg["phrases"][0], noun=bg["noun"])
    if edit.type == "add":
        words = f"{a['colour']} {a['kind']}"
        return template.format(it=it, obj=("an " if words[0] in "aeiou" else "a ") + words)
    if edit.type == "remove":
        return template.format(it=it, other=f"{a['colour']} {a['kind']}")
    if edit.type == "move":
        return template.format(it=it, where=CELL_NAMES[int(a["cell"])])
    return template.format(it=it, comparative=SIZE_COMPARATIVE[a["size"]], verb=_SIZE_VERB[a["size"]])


def _content_key(scene: Scene) -> tuple:
    """What a text can ask of a target: the background and the instances at their sizes (cells left out)."""
    return (scene.background, tuple(sorted(o.instance for o in scene.objects)))


@dataclass
class _Query:
    id: str
    reference: Scene
    anchor: WorldObject
    twin: WorldObject
    edit: Edit
    text: str
    target: Scene
    instance_negs: list[Scene]
    context_negs: list[Scene]


def build_oacir(rng: np.random.Generator, n_queries: int, prefix: str, taken: set, n_distractors: int
                ) -> tuple[list[GalleryItem], list[dict]]:
    """(gallery, query records) of one split (pure); `taken` holds layout keys no scene may reuse, and gets this
    split's keys added."""
    drafts: list[_Query] = []
    foreign = set(taken)
    seen: set = set()
    while len(drafts) < n_queries:
        ref, anchor, twin = sample_reference(rng)
        base = Scene(ref.background, tuple(o for o in ref.objects if o is not twin))
        types = applicable(ref, anchor)
        edit_type = str(rng.choice(types))
        edit = sample_context_edit(rng, base, anchor, edit_type)
        target = apply_context_edit(base, edit)
        marks = [twin.mark] + [str(m) for m in rng.permutation([m for m in MARKS if m not in (anchor.mark,
                                                                                            twin.mark)])]
        ti = _anchor_index(target, anchor)
        instance_negs = [target.with_object(ti, mark=m) for m in marks[:N_INSTANCE_DISTRACTORS]]
        context_negs = [base]
        others = [t for t in types if t != edit_type]
        alt = str(rng.choice(others))
        context_negs.append(apply_context_edit(base, sample_context_edit(rng, base, anchor, alt)))
        if edit_type in ("background", "add", "move") and (edit_type != "move" or len(base.free_cells()) > 1):
            context_negs.append(apply_context_edit(base, sample_context_edit(rng, base, anchor, edit_type,
                                                                             exclude=edit.args)))
        scenes = [ref, target, *instance_negs, *context_negs]
        keys = [s.layout_key() for s in scenes]
        if len(set(keys)) < len(keys) or any(k in foreign or k in seen for k in keys):
            continue
        if any(_satisfies(s, target, anchor, edit_type) for s in scenes[2:]):
            continue
        seen.update(keys)
        text = context_text(anchor, edit, int(rng.integers(len(PHRASINGS[edit_type]))), bool(rng.random() < 0.5))
        drafts.append(_Query(f"{prefix}q{len(drafts):05d}", ref, anchor, twin, edit, text, target, instance_negs,
                             context_negs))
    randoms = []
    while len(randoms) < n_distractors:
        s = sample_scene(rng)
        s = Scene(s.background, tuple(replace(o, mark=str(rng.choice(MARKS))) for o in s.objects))
        if s.layout_key() not in foreign and s.layout_key() not in seen:
            seen.add(s.layout_key())
            randoms.append(s)
    taken.update(seen)
    # the gallery in a random order of ids; a query whose target another gallery scene also satisfies is dropped
    scenes = [s for q in drafts for s in (q.reference, q.target, *q.instance_negs, *q.context_negs)] + randoms
    order = rng.permutation(len(scenes))
    ids = {scenes[int(i)].layout_key(): f"{prefix}g{n:06d}" for n, i in enumerate(order)}
    gallery = sorted((GalleryItem(ids[s.layout_key()], s) for s in scenes), key=lambda g: g.id)
    by_content: dict[tuple, list[Scene]] = {}
    for s in scenes:
        by_content.setdefault(_content_key(s), []).append(s)
    records = []
    for q in drafts:
        if any(s is not q.target and _satisfies(s, q.target, q.anchor, q.edit.type)
               for s in by_content[_content_key(q.target)]):
            continue
        ref_id, target_id = ids[q.reference.layout_key()], ids[q.target.layout_key()]
        inst = [ids[s.layout_key()] for s in q.instance_negs]
        ctx = [ids[s.layout_key()] for s in q.context_negs]
        rest = [target_id, *inst, *ctx]
        subset = [ref_id] + [rest[int(i)] for i in rng.permutation(len(rest))]
        records.append({"id": q.id, "reference": ref_id, "modification": q.text, "target": target_id,
                        "subset": subset,
                        "edit": Edit(q.edit.type, q.reference.objects.index(q.anchor), q.edit.args).to_dict(),
                        "box": object_box(q.anchor),
                        "instance": instance_id(q.anchor), "twin": instance_id(q.twin),
                        "instance_distractors": inst, "context_distractors": ctx})
    return gallery, records


def _satisfies(scene: Scene, target: Scene, anchor: WorldObject, edit_type: str) -> bool:
    """Whether `scene` shows what the text asks of `target`: its background and instances at their sizes, and for
    "move" the anchored instance in the target's cell."""
    if _content_key(scene) != _content_key(target):
        return False
    return edit_type != "move" or (scene.objects[_anchor_index(scene, anchor)].cell
                                   == target.objects[_anchor_index(target, anchor)].cell)


def _anchor_index(scene: Scene, anchor: WorldObject) -> int:
    """Where the anchored instance (its kind, colour and mark) is in `scene`."""
    return next(i for i, o in enumerate(scene.objects) if instance_id(o) == instance_id(anchor))


def _world_keys(world: Path) -> set:
    """Layout keys of the world's own scenes: the pairs and galleries world.json counts (so that other protocols
    written since, this one included, change nothing)."""
    counts = read_json(world / "world.json").get("counts") or {}
    keys = set()
    for rel in sorted(counts):
        if rel.startswith("pairs/") or rel.endswith("/gallery.jsonl"):
            for r in read_jsonl(world / rel, required=("scene",)):
                keys |= Scene.from_dict(r["scene"]).taken_layouts(pairs=rel.startswith("pairs/"))
    return keys


def split_counts(cfg: dict, n_queries: int | None = None) -> dict[str, int]:
    """Queries per split: val and test as the world's `<split>_single`, train 4 x test_single; `n_queries`
    overrides all three."""
    if n_queries is not None:
        return {s: int(n_queries) for s in SPLITS}
    try:
        return {"train": TRAIN_FACTOR * int(cfg["test_single"]), "val": int(cfg["val_single"]),
                "test": int(cfg["test_single"])}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"world.json's config gives no usable query counts ({exc}); pass --queries N") from None


def plan_oacir(world: str | Path, splits: tuple[str, ...] = SPLITS, n_queries: int | None = None,
               distractor_frac: float | None = None) -> dict[str, tuple[list[dict], list[dict]]]:
    """{split: (gallery records, query records)} for `splits` (pure: nothing is written or drawn)."""
    world = Path(world)
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise ValueError(f"--splits {','.join(splits)}: {', '.join(bad) or 'none'} is not an OACIR split; choose "
                         f"from {','.join(SPLITS)}")
    if not (world / "world.json").is_file():
        raise FileNotFoundError(f"--world {world} holds no world.json: generate the world first "
                                "(`foco world generate`)")
    cfg = read_json(world / "world.json").get("config") or {}
    seed = cfg.get("seed")
    if not isinstance(seed, int):
        raise ValueError(f"{world / 'world.json'} records no integer config.seed; regenerate the world")
    counts = split_counts(cfg, n_queries)
    frac = float(cfg.get("distractor_frac", 0.2) if distractor_frac is None else distractor_frac)
    taken = _world_keys(world)
    wanted = max(PLAN_ORDER.index(s) for s in splits)
    out = {}
    for split in PLAN_ORDER[: wanted + 1]:
        rng = _split_rng(seed, f"{split}/oacir")
        n = counts[split]
        gallery, queries = build_oacir(rng, n, f"{split}-o", taken, int(round(frac * n)))
        if split in splits:
            out[split] = ([{"id": g.id, "image": f"benchmarks/{split}/{PROTOCOL}/images/{g.id}.png",
                            "scene": g.scene.to_dict(), "instances": scene_instances(g.scene)} for g in gallery],
                          queries)
    return {s: out[s] for s in SPLITS if s in out}


def generate_oacir(world: str | Path, splits: tuple[str, ...] = SPLITS, n_queries: int | None = None,
                   out: str | Path | None = None) -> dict[str, dict]:
    """Writes the OACIR protocol of each of `splits` under `out` (default: the world folder) and returns
    {split: summary}. Resumable: images already on disk are kept when they were rendered for the same plan (its
    fingerprint is written before the first image: another count or world re-renders every image, and images of an
    earlier plan are removed); the record, with every image's sha256 and its own (`record_sha256`), is written
    last."""
    world = Path(world)
    out = Path(out) if out is not None else world
    cfg = read_json(world / "world.json").get("config") or {} if (world / "world.json").is_file() else {}
    planned = plan_oacir(world, splits, n_queries)
    asked = split_counts(cfg, n_queries)
    summaries = {}
    for split, (gallery, queries) in planned.items():
        base = out / "benchmarks" / split / PROTOCOL
        (base / "images").mkdir(parents=True, exist_ok=True)
        (base / RECORD).unlink(missing_ok=True)  # no record while the folder changes: readers refuse it meanwhile
        start_plan(base, base / "images", gallery)  # before the first image: a killed run resumes this plan
        jobs = [(str(out / g["image"]), g["scene"], None) for g in gallery if not (out / g["image"]).exists()]
        for job in progress(jobs, desc=f"rendering {split}/oacir"):
            _render_job(job)
        images = {g["image"]: sha256_file(out / g["image"]) for g in gallery}
        _dump_jsonl(base / "gallery.jsonl", gallery)
        _dump_jsonl(base / "queries.jsonl", queries)
        summary = {"format": FORMAT, "protocol": PROTOCOL, "split": split, "seed": cfg.get("seed"),
                   "domain": DOMAIN, "queries": len(queries), "gallery": len(gallery),
                   # drafted queries whose target another gallery image also satisfies are left out, counted here
                   "queries_asked": asked[split], "queries_dropped": asked[split] - len(queries),
                   "box_format": "x0, y0, x1, y1 pixels", "image_size": IMAGE_SIZE, "marks": list(MARKS),
                   "instance_id": "kind/colour/mark", "edit_types": list(EDIT_TYPES),
                   "manifests_sha256": {f: sha256_file(base / f) for f in FILES}, "images_sha256": images,
                   "world": world_fingerprint(world)}
        summary["record_sha256"] = record_digest(summary)
        atomic_write_text(base / RECORD, json.dumps(summary, indent=2, sort_keys=True) + "\n")
        summaries[split] = summary
    return summaries


@dataclass
class OacirAnnotations:
    """What the OACIR protocol adds to a `single`-like benchmark, in the order of `load_benchmark`'s queries."""

    boxes: torch.Tensor  # (Q, 4) x0, y0, x1, y1 in pixels of the image_size x image_size reference
    instances: list[str]  # the anchored instance's id ("kind/colour/mark"), per query
    gallery_instances: dict[str, tuple[str, ...]]  # gallery id -> the instance ids it shows
    image_size: int


def load_oacir(root: str | Path, split: str = "test") -> OacirAnnotations:
    """Boxes and instance ids of `split`'s OACIR protocol; a malformed line raises ManifestError naming it."""
    bench = load_benchmark(root, split, PROTOCOL)
    base = Path(root) / "benchmarks" / split / PROTOCOL
    qpath, gpath = base / "queries.jsonl", base / "gallery.jsonl"
    boxes, instances = [], []
    for lineno, r in enumerate(read_jsonl(qpath, required=("id", "box", "instance")), 1):
        box = r["box"]
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float))
                                                                and not isinstance(v, bool) for v in box)):
            raise ManifestError(f"{qpath}:{lineno}: field box should be 4 numbers x0, y0, x1, y1, not {box!r:.40}")
        if not isinstance(r["instance"], str):
            raise ManifestError(f"{qpath}:{lineno}: field instance should be a string, not {r['instance']!r:.40}")
        boxes.append([float(v) for v in box])
        instances.append(r["instance"])
    gallery = {}
    for lineno, g in enumerate(read_jsonl(gpath, required=("id", "instances")), 1):
        if not (isinstance(g["instances"], list) and all(isinstance(v, str) for v in g["instances"])):
            raise ManifestError(f"{gpath}:{lineno}: field instances should be a list of strings")
        gallery[str(g["id"])] = tuple(g["instances"])
    if len(instances) != len(bench.query_ids):
        raise ManifestError(f"{qpath}: {len(instances)} boxes for {len(bench.query_ids)} queries")
    size = int(read_json(base / RECORD)["image_size"])
    return OacirAnnotations(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), instances, gallery, size)


def oacir_statistics(root: str | Path, split: str = "test") -> dict:
    """Quadruples, gallery size, instance distractors per query (gallery images showing the query's kind, colour
    and size with another mark: mean, min), context distractors per query (images showing the instance itself
    other than the target: mean) and edit type counts."""
    bench = load_benchmark(root, split, PROTOCOL)
    base = Path(root) / "benchmarks" / split / PROTOCOL
    scenes = {str(g["id"]): Scene.from_dict(g["scene"]) for g in read_jsonl(base / "gallery.jsonl")}
    queries = read_jsonl(base / "queries.jsonl")
    showing: dict[tuple, set] = {}  # (kind, colour, size) -> gallery ids; instance id -> gallery ids
    by_instance: dict[str, set] = {}
    for gid, s in scenes.items():
        for o in s.objects:
            if o.mark is not None:
                showing.setdefault(o.semantic, set()).add(gid)
                by_instance.setdefault(instance_id(o), set()).add(gid)
    n_inst, n_ctx = [], []
    for q in queries:
        target = scenes[q["target"]]
        anchor = target.objects[next(i for i, o in enumerate(target.objects) if instance_id(o) == q["instance"])]
        own = by_instance[q["instance"]]
        n_inst.append(len(showing[anchor.semantic] - own))
        n_ctx.append(len(own - {q["target"], q["reference"]}))
    edits: dict[str, int] = {}
    for t in bench.edit_types:
        edits[t] = edits.get(t, 0) + 1
    n = max(len(queries), 1)
    return {"split": split, "quadruples": len(queries), "gallery": len(scenes),
            "instance_distractors_mean": round(sum(n_inst) / n, 3), "instance_distractors_min": min(n_inst or [0]),
            "context_distractors_mean": round(sum(n_ctx) / n, 3), "edit_types": dict(sorted(edits.items()))}
