"""The "ambiguous" world benchmark: two objects of one kind, a pronoun, and a box that says which one.

Each reference holds two objects of the same kind (shape) that differ in colour or size, plus 0-2 objects of other
kinds. The modification names no object ("make it blue", "shrink it", "turn it into a star", "remove it"); the
query's `box` (x0, y0, x1, y1, in pixels of the 64 x 64 image) surrounds the intended object. The target is the
reference with that object edited; the `confuser` is the same edit applied to the other object of the same kind
and is always among the 4 hard negatives of the subset (the others come from `hard_negative_edits`). Without the
box the text cannot tell the target from the confuser.

Files: the `single` benchmark format of docs/world.md, in its own split `<split>-ambiguous`, with two more query
fields, `box` and `confuser` (a gallery id)::

    benchmarks/<split>-ambiguous/single/{gallery,queries}.jsonl, ambiguous.json
    images/<split>-ambiguous-single/<id>.png

so that `load_benchmark(root, "test-ambiguous", "single")`, `foco features extract --split test-ambiguous/single`
and `foco.evaluate` read it like any world benchmark. The world's own files are not touched; no scene of the world
is reused. The same world gives byte-identical files, whatever else was generated before: the val and test variants
are therefore drawn independently (separate seeds), not excluded from each other.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..utils.io import atomic_write_text, read_json, read_jsonl, sha256_file
from ..utils.progress import progress
from .benchmark import SUBSET_SIZE, Benchmark, GalleryItem, Query, _settle_ground_truth, _shuffle_ids
from .captions import article
from .edits import Edit, apply_edit, hard_negative_edits, sample_edit
from .generate import _bench_records, _dump_jsonl, _render_job, _split_rng, start_plan
from .manifest import record_digest
from .render import SUPERSAMPLE
from .scene import MAX_JITTER, Scene, WorldObject, sample_object, sample_scene
from .vocab import BACKGROUNDS, COLOURS, GRID, IMAGE_SIZE, SHAPES, SIZE_COMPARATIVE, SIZES

PROTOCOL = "single"
EDIT_TYPES = ("colour", "size", "replace", "remove")
PRONOUN_PHRASINGS: dict[str, tuple[str, ...]] = {
    "colour": ("make it {colour}", "paint it {colour}", "turn it {colour}", "change its colour to {colour}"),
    "size": ("make it {comparative}", "{verb} it"),
    "replace": ("replace it with {new}", "turn it into {new}", "swap it for {new}", "change it into {new}"),
    "remove": ("remove it", "get rid of it", "take it away", "delete it"),
}
_SIZE_VERB = {"large": "enlarge", "small": "shrink"}


def split_name(split: str) -> str:
    """"test" -> "test-ambiguous", the benchmark split the variant is written to."""
    return f"{split}-ambiguous"


def object_box(obj: WorldObject, size: int = IMAGE_SIZE) -> list[float]:
    """(x0, y0, x1, y1) of the square `render.py` draws `obj` into, in pixels of the `size` x `size` image."""
    big = size * SUPERSAMPLE
    cell = big // GRID
    side = max(4, int(round(cell * SIZES[obj.size])))
    row, col = divmod(obj.cell, GRID)
    x0 = col * cell + cell // 2 + obj.jitter[0] * SUPERSAMPLE - side // 2
    y0 = row * cell + cell // 2 + obj.jitter[1] * SUPERSAMPLE - side // 2
    return [round(v / SUPERSAMPLE, 2) for v in (x0, y0, x0 + side, y0 + side)]


def pronoun_text(scene: Scene, edit: Edit, phrasing: int) -> str:
    """The instruction for `edit` that names no object."""
    a = edit.args
    template = PRONOUN_PHRASINGS[edit.type][phrasing % len(PRONOUN_PHRASINGS[edit.type])]
    if edit.type == "colour":
        return template.format(colour=a["colour"])
    if edit.type == "size":
        return template.format(comparative=SIZE_COMPARATIVE[a["size"]], verb=_SIZE_VERB[a["size"]])
    if edit.type == "replace":
        return template.format(new=article(a["kind"]))
    return template


def sample_twin_scene(rng: np.random.Generator) -> tuple[Scene, tuple[int, int]]:
    """A scene with exactly two objects of one shape kind, differing in colour or size, and 0-2 of other kinds.
    Returns the scene and the indices of the two twins in `scene.objects`."""
    n = int(rng.integers(2, GRID * GRID + 1))
    kind = str(rng.choice(SHAPES))
    cells = [int(c) for c in rng.permutation(GRID * GRID)[:n]]
    twins = []
    while len(twins) < 2:
        obj = WorldObject(kind, str(rng.choice(list(COLOURS))), str(rng.choice(list(SIZES))), cells[len(twins)],
                          (int(rng.integers(-MAX_JITTER, MAX_JITTER + 1)), int(rng.integers(-MAX_JITTER, MAX_JITTER + 1))))
        if not twins or obj.semantic != twins[0].semantic:
            twins.append(obj)
    others = []
    for c in cells[2:]:
        obj = sample_object(rng, c, [], 0.0)
        while obj.kind == kind:
            obj = sample_object(rng, c, [], 0.0)
        others.append(obj)
    objs = tuple(sorted(twins + others, key=lambda o: o.cell))
    scene = Scene(str(rng.choice(list(BACKGROUNDS))), objs)
    idx = tuple(i for i, o in enumerate(objs) if o in twins)
    return scene, (idx[0], idx[1])


@dataclass
class _Extra:
    box: list[float]
    confuser: Scene


def build_ambiguous(rng: np.random.Generator, n_queries: int, prefix: str, taken: set, n_distractors: int
                    ) -> tuple[Benchmark, dict[str, _Extra]]:
    """Queries, gallery and per-query box and confuser scene; `taken` holds layout keys no scene may reuse."""
    gallery: list[GalleryItem] = []
    queries: list[Query] = []
    extras: dict[str, _Extra] = {}
    by_layout: dict[tuple, str] = {}
    foreign = set(taken)

    def add(scene: Scene) -> str:
        key = scene.layout_key()
        if key not in by_layout:
            by_layout[key] = f"tmp{len(gallery)}"
            gallery.append(GalleryItem(by_layout[key], scene))
            taken.add(key)
        return by_layout[key]

    while len(queries) < n_queries:
        ref, (i, j) = sample_twin_scene(rng)
        if ref.layout_key() in taken:
            continue
        intended, other = (i, j) if rng.random() < 0.5 else (j, i)
        edit = sample_edit(rng, ref, str(rng.choice(EDIT_TYPES)), index=intended)
        target = apply_edit(ref, edit)
        confuser = apply_edit(ref, Edit(edit.type, other, dict(edit.args)))
        banned = {target.semantic_key(), ref.semantic_key()}
        if confuser.semantic_key() in banned:
            continue  # e.g. "make it bigger" when the other one is already large
        negatives, seen = [confuser], banned | {confuser.semantic_key()}
        for e in hard_negative_edits(rng, ref, edit, 2 * SUBSET_SIZE):
            neg = apply_edit(ref, e)
            if neg.semantic_key() not in seen:
                negatives.append(neg)
                seen.add(neg.semantic_key())
        negatives = negatives[:SUBSET_SIZE - 2]
        if len(negatives) < SUBSET_SIZE - 2 or any(s.layout_key() in foreign for s in [target, *negatives]):
            continue
        text = pronoun_text(ref, edit, int(rng.integers(len(PRONOUN_PHRASINGS[edit.type]))))
        ref_id, target_id = add(ref), add(target)
        neg_ids = [add(s) for s in negatives]
        qid = f"{prefix}q{len(queries):05d}"
        queries.append(Query(qid, ref_id, text, edit, [target_id], [ref_id, target_id, *neg_ids]))
        extras[qid] = _Extra(object_box(ref.objects[intended]), confuser)
    while n_distractors > 0:
        s = sample_scene(rng)
        if s.layout_key() not in taken:
            add(s)
            n_distractors -= 1
    bench = _settle_ground_truth(_shuffle_ids(rng, Benchmark(PROTOCOL, gallery, queries), prefix))
    return bench, {q.id: extras[q.id] for q in bench.queries}


def world_layout_keys(root: str | Path, skip: str | Path | None = None) -> set:
    """Layout keys of every scene in a world's pairs and benchmark galleries (except under `skip`)."""
    root = Path(root)
    files = sorted(root.glob("pairs/*.jsonl")) + sorted(root.glob("benchmarks/*/*/gallery.jsonl"))
    keys = set()
    for path in files:
        if skip is not None and Path(skip) in path.parents:
            continue
        for r in read_jsonl(path, required=("scene",)):
            keys |= Scene.from_dict(r["scene"]).taken_layouts(pairs=path.parent.name == "pairs")
    return keys


def generate_ambiguous_split(world: str | Path, split: str = "test", n_queries: int | None = None,
                             out: str | Path | None = None, distractor_frac: float = 0.2) -> dict:
    """Writes the ambiguous variant of `split` and returns its summary.

    Args:
        world: a generated world folder (its world.json gives the seed; its scenes are never reused).
        split: "val" or "test"; the files go to benchmarks/<split>-ambiguous/single.
        n_queries: queries to sample (default: the world's `<split>_single` count); a few are dropped when the
            target has a semantic twin in the gallery, as in `single`.
        out: the root to write under (default: `world` itself; its own files are never modified).
        distractor_frac: random scenes added to the gallery, as a fraction of `n_queries`.
    """
    world = Path(world)
    out = Path(out) if out is not None else world
    cfg = read_json(world / "world.json")["config"]
    n = int(n_queries if n_queries is not None else cfg[f"{split}_single"])
    part = split_name(split)
    base = out / "benchmarks" / part / PROTOCOL
    taken = world_layout_keys(world, skip=world / "benchmarks" / part)
    rng = _split_rng(int(cfg["seed"]), f"{split}/ambiguous")
    bench, extras = build_ambiguous(rng, n, prefix=f"{split}-a", taken=taken,
                                    n_distractors=int(round(distractor_frac * n)))
    gallery, queries = _bench_records(bench, f"{part}-{PROTOCOL}")
    by_layout = {g.scene.layout_key(): g.id for g in bench.gallery}
    for rec in queries:
        rec["box"] = extras[rec["id"]].box
        rec["confuser"] = by_layout[extras[rec["id"]].confuser.layout_key()]
    base.mkdir(parents=True, exist_ok=True)
    (base / "ambiguous.json").unlink(missing_ok=True)  # no record while the folder changes
    start_plan(base, out / "images" / f"{part}-{PROTOCOL}", gallery)  # before the first image
    jobs = [(str(out / g["image"]), g["scene"], None) for g in gallery if not (out / g["image"]).exists()]
    if jobs:
        (out / gallery[0]["image"]).parent.mkdir(parents=True, exist_ok=True)
    for job in progress(jobs, desc=f"rendering {part}"):
        _render_job(job)
    _dump_jsonl(base / "gallery.jsonl", gallery)
    _dump_jsonl(base / "queries.jsonl", queries)
    summary = {"source_world": str(world), "seed": int(cfg["seed"]), "split": part, "protocol": PROTOCOL,
               "queries": len(queries), "gallery": len(gallery), "box_format": "x0, y0, x1, y1 pixels",
               "image_size": IMAGE_SIZE, "images_sha256": {g["image"]: sha256_file(out / g["image"]) for g in gallery},
               "manifests_sha256": {f: sha256_file(base / f) for f in ("gallery.jsonl", "queries.jsonl")}}
    summary["record_sha256"] = record_digest(summary)
    atomic_write_text(base / "ambiguous.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


@dataclass
class AmbiguousAnnotations:
    """What the ambiguous split adds to a `single` benchmark, in the order of `load_benchmark`'s queries."""

    boxes: torch.Tensor  # (Q, 4) x0, y0, x1, y1 in pixels of the image_size x image_size reference
    confusers: list[str]  # gallery id of the other object's edit, per query
    image_size: int


def load_ambiguous(root: str | Path, split: str = "test") -> AmbiguousAnnotations:
    """Boxes and confusers of `<split>-ambiguous` (pass "test", not "test-ambiguous")."""
    from .verify import _ambiguous_hashes
    base = Path(root) / "benchmarks" / split_name(split) / PROTOCOL
    _ambiguous_hashes(base / "ambiguous.json")  # its own fields and its two files, where it records them
    recs = read_jsonl(base / "queries.jsonl", required=("id", "box", "confuser"))
    size = int(read_json(base / "ambiguous.json")["image_size"])
    return AmbiguousAnnotations(torch.tensor([r["box"] for r in recs], dtype=torch.float32),
                                [str(r["confuser"]) for r in recs], size)
