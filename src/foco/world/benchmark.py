"""CIR benchmarks of the world, for evaluation only: queries, galleries with hard negatives, ground truth.

Two protocols:
* ``single`` (CIRR-like): one target per query. Each query has a 6-image subset (reference, target and four hard
  negatives); recall is computed with the reference removed from the ranking.
* ``multi`` (CIRCO-like): several gallery scenes satisfy the edit. They differ only in what no text describes
  (where the objects are), and the ground truth is every gallery scene semantically equal to the edited reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .edits import Edit, applicable_types, apply_edit, edit_text, hard_negative_edits, sample_edit, PHRASINGS
from .scene import Scene, relayout, sample_scene, Stamp

SUBSET_SIZE = 6


@dataclass
class GalleryItem:
    id: str
    scene: Scene


@dataclass
class Query:
    id: str
    reference: str
    modification: str
    edit: Edit
    targets: list[str]
    subset: list[str] = field(default_factory=list)


@dataclass
class Benchmark:
    protocol: str  # "single" or "multi"
    gallery: list[GalleryItem]
    queries: list[Query]


def build_benchmark(rng: np.random.Generator, protocol: str, n_queries: int, prefix: str, taken: set,
                    n_distractors: int, stamps: list[Stamp] = (), stamp_prob: float = 0.0) -> Benchmark:
    """Samples `n_queries` queries and their gallery. `taken` holds layout keys of scenes used by other splits;
    new scenes are added to it so that splits stay disjoint."""
    gallery: list[GalleryItem] = []
    queries: list[Query] = []
    by_layout: dict[tuple, str] = {}
    foreign = set(taken)  # scenes of other splits: never reused here, not even as a hard negative

    def add(scene: Scene) -> str:
        key = scene.layout_key()
        if key in by_layout:
            return by_layout[key]
        gid = f"tmp{len(gallery)}"  # renamed in a random order by _shuffle_ids
        gallery.append(GalleryItem(gid, scene))
        by_layout[key] = gid
        taken.add(key)
        return gid

    def fresh_scene() -> Scene:
        while True:
            s = sample_scene(rng, stamps, stamp_prob)
            if s.layout_key() not in taken:
                return s

    while len(queries) < n_queries:
        ref = fresh_scene()
        edit_type = str(rng.choice(applicable_types(ref)))
        edit = sample_edit(rng, ref, edit_type)
        target = apply_edit(ref, edit)
        negatives = [apply_edit(ref, e) for e in hard_negative_edits(rng, ref, edit, SUBSET_SIZE - 2)]
        negatives = [n for n in negatives if n.semantic_key() not in (target.semantic_key(), ref.semantic_key())]
        if protocol == "single":
            if len(negatives) < SUBSET_SIZE - 2:
                continue
            targets = [target]
        else:
            targets = [target] + [relayout(target, rng) for _ in range(int(rng.integers(1, 4)))]
        if any(s.layout_key() in foreign for s in [*targets, *negatives]):
            continue
        text = edit_text(ref, edit, int(rng.integers(len(PHRASINGS[edit.type]))))
        ref_id = add(ref)
        target_ids = list(dict.fromkeys(add(t) for t in targets))
        neg_ids = [add(n) for n in negatives]
        qid = f"{prefix}q{len(queries):05d}"
        subset = [ref_id, target_ids[0]] + neg_ids[: SUBSET_SIZE - 2] if protocol == "single" else []
        queries.append(Query(qid, ref_id, text, edit, target_ids, subset))
    for _ in range(n_distractors):
        add(fresh_scene())
    return _settle_ground_truth(_shuffle_ids(rng, Benchmark(protocol, gallery, queries), prefix))


def _shuffle_ids(rng: np.random.Generator, bench: Benchmark, prefix: str) -> Benchmark:
    """Renumbers the gallery in a random order and shuffles each subset, so that neither an id nor a position
    gives away which image is the target."""
    order = rng.permutation(len(bench.gallery))
    rename = {bench.gallery[int(i)].id: f"{prefix}g{n:06d}" for n, i in enumerate(order)}
    bench.gallery = sorted((GalleryItem(rename[g.id], g.scene) for g in bench.gallery), key=lambda g: g.id)
    for q in bench.queries:
        q.reference = rename[q.reference]
        q.targets = [rename[t] for t in q.targets]
        q.subset = [rename[s] for s in rng.permutation(q.subset)] if q.subset else []
    return bench


def _settle_ground_truth(bench: Benchmark) -> Benchmark:
    """Makes the ground truth exact: in ``multi`` every gallery scene semantically equal to the target is a target;
    in ``single`` a query whose target has a semantic twin elsewhere in the gallery is dropped."""
    by_semantic: dict[tuple, list[str]] = {}
    scenes = {g.id: g.scene for g in bench.gallery}
    for g in bench.gallery:
        by_semantic.setdefault(g.scene.semantic_key(), []).append(g.id)
    kept = []
    for q in bench.queries:
        twins = by_semantic[scenes[q.targets[0]].semantic_key()]
        if bench.protocol == "multi":
            q.targets = sorted(twins)
            kept.append(q)
        elif twins == [q.targets[0]] and len(set(q.subset)) == SUBSET_SIZE:
            kept.append(q)
    bench.queries = kept
    return bench
