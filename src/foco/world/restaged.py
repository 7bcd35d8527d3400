"""The `restaged` world protocol: `described`'s queries over a gallery in which every image is another picture of
its scene.

On the world's `single` protocol a target is its reference redrawn pixel for pixel with the edit applied; on CIRR a
target is another photograph of related content. `restaged` keeps every `single` query of a split (reference,
target, subset, edit type, gallery ids) and redraws every gallery image with its nuisance factors resampled:

* layout: each object moves to another free cell with probability `strength`, and its offset inside the cell is
  drawn anew (up to what keeps it inside its cell), blended with its old one by `strength`;
* size within its class: the side is scaled by 1 +- 0.15 * strength (small 0.38-0.52, large 0.70-0.94 of a cell:
  the classes never meet);
* the background: its brightness by 1 +- 0.15 * strength, its texture reseeded with probability `strength`, its
  pattern (and a horizon's height) shifted by up to `strength` of a half-image;
* the drawing: each object rotated by up to 15 * strength degrees, a shape's fill tinted by up to 12 * strength
  per RGB channel.

What a caption or an edit text can say (kinds, colours, size classes, background) never changes: a restaged scene
has its source's `semantic_key`. Every gallery image is restaged, hard negatives and references included, so the
target is not the one picture that looks different; a query's reference is its gallery image, so reference and
target are two independent pictures. `strength = 0` redraws the `single` images pixel for pixel.

The query text is the described protocol's (`described.py`) at `share`: the instruction followed by a partial
description of the target, drawn with the same per-query generator, so restaged at share S and described at S read
the same texts. Both numbers are generator parameters; `docs/benchmarks.md` gives the calibrated pair.

Draws. Each gallery image has its own generator, seeded by the world's seed, the split and the image id, and the
number of draws does not depend on `strength` (one uniform per object for moving, one cell permutation, and fixed
numbers for offsets, scales, angles, tints, shade, texture and phase), so a larger strength moves the same images
further, and a calibration curve moves with `strength` alone.

Files (beside `single`; the world's own files are not touched)::

    benchmarks/<split>/restaged/gallery.jsonl   `single`'s gallery ids; "image" the restaged picture, "scene" its
                                                restaged scene, "look" how it is drawn (`render.Look`), "source"
                                                the `single` image it redraws
    benchmarks/<split>/restaged/queries.jsonl   `single`'s queries with the described text at `share`
    benchmarks/<split>/restaged/images/<id>.png the restaged pictures
    benchmarks/<split>/restaged/restaged.json   strength, share, the world's fingerprint, the sha256 of the `single`
                                                files it was made from, of its own two files and of every image

`load_benchmark(root, split, "restaged")` checks restaged.json against the world and its two files; `foco world
verify` also hashes every restaged image against it.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..utils.io import atomic_write_text, read_json, read_jsonl, sha256_file
from ..utils.ownership import check_folder, check_outputs, claim_folder, record_outputs
from ..utils.progress import progress
from .described import _query_rng, describe
from .manifest import RESTAGED_FILES as FILES, RESTAGED_RECORD as RECORD
from .manifest import load_benchmark, restaged_record
from .render import Look, render_scene
from .scene import MAX_JITTER, Scene
from .vocab import GRID, IMAGE_SIZE, SIZES

FORMAT = 1
SCALE_SPREAD = 0.15  # side multiplier 1 +- this, at strength 1
ANGLE_SPREAD = 15.0  # degrees, at strength 1
TINT_SPREAD = 12  # per RGB channel, at strength 1
SHADE_SPREAD = 0.15  # background brightness 1 +- this, at strength 1


def _image_rng(seed: int, split: str, image_id: str) -> np.random.Generator:
    """The image's own generator: the same draws whatever the strength, the other images or the order of writing."""
    digest = hashlib.sha256(f"restaged/{seed}/{split}/{image_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def restage(scene: Scene, strength: float, rng: np.random.Generator) -> tuple[Scene, Look]:
    """Another picture of `scene`: the same semantics, the nuisance resampled with `strength` in [0, 1].

    Returns (scene with new cells and offsets, look). At strength 0 both are the source's own drawing."""
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"--strength must lie in [0, 1], not {strength}")
    n, s = len(scene.objects), float(strength)
    # every draw first, a fixed number of them (module docstring)
    move = rng.random(n)  # (n,)
    cells = [int(c) for c in rng.permutation(GRID * GRID)]
    offsets = rng.uniform(-1.0, 1.0, (n, 2))
    scale_u, angle_u = rng.uniform(-1.0, 1.0, n), rng.uniform(-1.0, 1.0, n)
    tint_u = rng.uniform(-1.0, 1.0, (n, 3))
    shade_u, texture_u, phase_u = rng.uniform(-1.0, 1.0), rng.random(), rng.uniform(-1.0, 1.0)
    texture = int(rng.integers(2 ** 31))

    movers = [i for i in range(n) if move[i] < s]
    held = {o.cell for i, o in enumerate(scene.objects) if i not in movers}
    free = [c for c in cells if c not in held]
    cell_px = IMAGE_SIZE / GRID
    objs, scales = [], []
    for i, o in enumerate(scene.objects):
        scale = 1.0 + SCALE_SPREAD * s * float(scale_u[i])
        side_px = cell_px * SIZES[o.size] * scale
        # offsets that keep the object (rotated: up to 1.2 times its side) inside its cell; the world's own
        # offsets (MAX_JITTER) at least, so a large object (1.2 x side > cell - 2 x MAX_JITTER) may cross its cell's
        # edge, as in the world's own pictures (a review measured the worst pairwise overlap of object boxes at 10 %
        # at strength 1 against 7 % at 0, and the objects the picture's border cuts at 9.9 % against 6.5 %)
        reach = max(float(MAX_JITTER), (cell_px - 1.2 * side_px) / 2)
        jitter = tuple(int(round((1 - s) * o.jitter[k] + s * float(offsets[i, k]) * reach)) for k in range(2))
        cell = free.pop(0) if i in movers else o.cell
        objs.append(replace(o, cell=cell, jitter=jitter))
        scales.append(scale)
    # the scene's objects stay in their order (the look's per-object lists follow it)
    look = Look(shade=1.0 + SHADE_SPREAD * s * float(shade_u), texture=texture if texture_u < s else None,
                phase=s * float(phase_u), scales=tuple(scales),
                angles=tuple(ANGLE_SPREAD * s * float(a) for a in angle_u),
                tints=tuple(tuple(int(round(TINT_SPREAD * s * float(t))) for t in row) for row in tint_u))
    if s == 0.0:
        look = Look()
    return Scene(scene.background, tuple(objs)), look


def build_restaged(world: str | Path, split: str, strength: float, share: float
                   ) -> tuple[list[dict], list[dict]]:
    """(gallery, queries) records of `split`'s restaged protocol (pure: nothing is written or drawn)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"--share must lie in [0, 1], not {share}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"--strength must lie in [0, 1], not {strength}")
    world = Path(world)
    load_benchmark(world, split, "single")  # ids, targets, counts against world.json
    base = world / "benchmarks" / split / "single"
    seed = (read_json(world / "world.json").get("config") or {}).get("seed")
    if not isinstance(seed, int):
        raise ValueError(f"{world / 'world.json'} records no integer config.seed; regenerate the world")
    gallery = []
    scenes = {}
    for g in read_jsonl(base / "gallery.jsonl", required=("id", "image", "scene")):
        gid = str(g["id"])
        scenes[gid] = Scene.from_dict(g["scene"])
        scene, look = restage(scenes[gid], strength, _image_rng(seed, split, gid))
        gallery.append({"id": gid, "image": f"benchmarks/{split}/restaged/images/{gid}.png",
                        "scene": scene.to_dict(), "look": look.to_dict(), "source": g["image"]})
    queries = []
    for q in read_jsonl(base / "queries.jsonl", required=("id", "reference", "modification", "target")):
        text, parts = describe(str(q["modification"]), scenes[str(q["target"])], share,
                               _query_rng(seed, split, str(q["id"])))
        queries.append({**q, "instruction": q["modification"], "modification": text, "described": parts})
    return gallery, queries


def _render_job(args: tuple[str, dict, dict, str | None]) -> None:
    path, scene, look, stamps = args
    img = render_scene(Scene.from_dict(scene), stamps, look=Look.from_dict(look))
    tmp = path + ".tmp"
    img.save(tmp, format="PNG")
    os.replace(tmp, path)


def generate_restaged(world: str | Path, strength: float, share: float, splits: tuple[str, ...] = ("val", "test"),
                      force: bool = False, workers: int | None = None) -> dict:
    """Writes the restaged protocol of each of `splits` into the world folder and returns {split: summary}.

    Refused before anything is written: a split that already holds another (strength, share), or a benchmark split
    left at another pair than the one written now (val chooses slerp's alpha for test), unless `force`; and any
    file in the folders that foco did not write, unless `force`. Every image is drawn again on each run (a folder
    interrupted mid-way holds no record, so it is never read)."""
    from .generate import BENCH_SPLITS, _dump_jsonl, world_fingerprint
    world, strength, share = Path(world), float(strength), float(share)
    if not (world / "world.json").is_file():
        raise FileNotFoundError(f"--world {world} holds no world.json: generate the world first "
                                "(`foco world generate`)")
    bad = [s for s in splits if s not in BENCH_SPLITS]
    if bad or not splits:
        raise ValueError(f"--split {','.join(splits)}: {', '.join(bad) or 'none'} is not a benchmark split; choose "
                         "val, test or val,test")
    if not force:
        for split in BENCH_SPLITS:
            base = world / "benchmarks" / split / "restaged"
            rec = restaged_record(base)
            if rec is not None and (rec["strength"], rec["share"]) != (strength, share):
                what = ("features extracted from it are of other pictures or texts" if split in splits else
                        f"it would be left at another setting than {', '.join(splits)} (val chooses slerp's alpha "
                        "for test): write both with --split val,test")
                raise FileExistsError(f"{base} holds the restaged protocol at strength {rec['strength']} and share "
                                      f"{rec['share']}, not {strength} and {share}: {what}; or pass --force to "
                                      "replace it (and extract its features again into a new folder)")
    built = {split: build_restaged(world, split, strength, share) for split in splits}
    for split, (gallery, _) in built.items():
        base = world / "benchmarks" / split / "restaged"
        check_folder(base, (RECORD,), force, flag="folder")
        check_outputs(base, [base / f for f in (*FILES, RECORD)] + [world / g["image"] for g in gallery], force,
                      flag="folder")
    stamps = (read_json(world / "world.json").get("config") or {}).get("stamps_dir")
    out = {}
    for split, (gallery, queries) in built.items():
        base = world / "benchmarks" / split / "restaged"
        images = [world / g["image"] for g in gallery]
        claim_folder(base, "world restage", (RECORD,), force=True)
        (base / RECORD).unlink(missing_ok=True)  # no record while the folder changes: readers refuse it meanwhile
        record_outputs(base, [base / f for f in (*FILES, RECORD)] + images)
        (base / "images").mkdir(exist_ok=True)
        jobs = [(str(p), g["scene"], g["look"], stamps) for p, g in zip(images, gallery)]
        n_workers = workers or min(2, os.cpu_count() or 1)
        if n_workers > 1 and len(jobs) > 200:
            import multiprocessing as mp
            with mp.get_context("fork").Pool(n_workers) as pool:
                for _ in progress(pool.imap_unordered(_render_job, jobs, chunksize=64), total=len(jobs),
                                  desc=f"restaging {split}"):
                    pass
        else:
            for job in progress(jobs, desc=f"restaging {split}"):
                _render_job(job)
        _dump_jsonl(base / "gallery.jsonl", gallery)
        _dump_jsonl(base / "queries.jsonl", queries)
        single = world / "benchmarks" / split / "single"
        source = {str(r["id"]): r["scene"]["objects"] for r in read_jsonl(single / "gallery.jsonl")}
        moved = sum(1 for g in gallery for o, src in zip(g["scene"]["objects"], source[g["id"]])
                    if o["cell"] != src["cell"])
        n_objects = sum(len(g["scene"]["objects"]) for g in gallery)
        summary = {"format": FORMAT, "protocol": "restaged", "split": split, "strength": strength, "share": share,
                   "world": world_fingerprint(world), "queries": len(queries), "gallery": len(gallery),
                   "objects_moved": round(moved / max(n_objects, 1), 4),
                   "single_sha256": {f: sha256_file(single / f) for f in FILES},
                   "manifests_sha256": {f: sha256_file(base / f) for f in FILES},
                   "images_sha256": {g["id"]: sha256_file(p) for g, p in zip(gallery, images)}}
        atomic_write_text(base / RECORD, json.dumps(summary, indent=2, sort_keys=True) + "\n")
        out[split] = summary
    return out

