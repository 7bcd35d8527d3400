"""The `described` world protocol: `single`'s queries, each instruction followed by a partial description of the
target scene.

CIRR's annotators describe the target ("has two dogs of the same breed on the floor"); the world's instructions
("make the circle blue") only name the edit, so on `single` text alone finds almost nothing, where on CIRR it beats
the reference image (text-only R@1 20.9 against image-only 7.4 with ViT-L/14, Pic2Word's table). `described` keeps
every `single` query of a split as it is (reference, target, subset, edit type, and the gallery, image for image)
and appends what the target shows, in the words of the world's captions (`captions.py`): each object's phrase ("a
large blue circle") and the background's ("on a beach"), each with probability `share`:

    make the circle blue, so the image shows a large blue circle and a small grey star on a beach
    remove the star, on a beach                     (only the background was drawn)
    make the circle blue                            (nothing was drawn)

Draws. Each query has one uniform number per component of its target (objects, then the background) and one
order of the objects, from a generator seeded by the world's seed, the split and the query id, and independent of
`share`; a component is described when its number is below `share`. So a larger share describes a superset of what
a smaller one does, query by query, and the calibration curve (`docs/benchmarks.md`) moves with `share` alone. No
other split's scene and nothing of a method is read: only the split's own `single` files.

Files (beside `single`; the world's own files are not touched)::

    benchmarks/<split>/described/gallery.jsonl    `single`'s gallery, line for line
    benchmarks/<split>/described/queries.jsonl    `single`'s queries; "modification" is the described text,
                                                  "instruction" the original, "described" what was added
    benchmarks/<split>/described/described.json   share, the world's fingerprint, the sha256 of the `single`
                                                  files it was made from and of its own two files

`load_benchmark(root, split, "described")` checks described.json against the world and the files (a `described`
folder of another world, or edited since, is refused), so `foco features extract --split val/described`, `foco eval
--protocols described` and `foco world export --format cirr --protocol described` read it like `single`.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..utils.io import atomic_write_text, read_json, read_jsonl, sha256_file
from ..utils.ownership import check_folder, check_outputs, claim_folder, record_outputs
from .captions import join_list, object_phrase
from .manifest import DESCRIBED_FILES as FILES, DESCRIBED_RECORD as RECORD
from .manifest import described_record as _record
from .manifest import load_benchmark
from .scene import Scene
from .vocab import BACKGROUNDS

FORMAT = 1


def _query_rng(seed: int, split: str, query_id: str) -> np.random.Generator:
    """The query's own generator: the same draws whatever the share, the other queries or the order of writing."""
    digest = hashlib.sha256(f"described/{seed}/{split}/{query_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def describe(instruction: str, target: Scene, share: float, rng: np.random.Generator) -> tuple[str, list[str]]:
    """The described text of one query and the components it names ("object:<i>", "background").

    The generator's draws do not depend on `share`: len(objects) + 1 uniforms, one permutation, one phrase choice."""
    u = rng.random(len(target.objects) + 1)  # (objects..., background)
    order = [int(i) for i in rng.permutation(len(target.objects))]
    phrases = BACKGROUNDS[target.background]["phrases"]
    bg_phrase = phrases[int(rng.integers(len(phrases)))]
    named = [i for i in order if u[i] < share]
    with_bg = bool(u[-1] < share)
    parts = [f"object:{i}" for i in named] + (["background"] if with_bg else [])
    if named:
        text = f"{instruction}, so the image shows {join_list([object_phrase(target.objects[i]) for i in named])}"
        return (text + f" {bg_phrase}" if with_bg else text), parts
    if with_bg:
        return f"{instruction}, {bg_phrase}", parts
    return instruction, parts


def build_described(world: str | Path, split: str, share: float) -> tuple[list[dict], list[dict]]:
    """(gallery, queries) records of `split`'s described protocol at `share` (pure: nothing is written). The
    `single` files are read through `load_benchmark` first, so that a damaged or miscounted source is refused."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"--share must lie in [0, 1], not {share}")
    world = Path(world)
    load_benchmark(world, split, "single")  # ids, targets, counts against world.json
    base = world / "benchmarks" / split / "single"
    seed = (read_json(world / "world.json").get("config") or {}).get("seed")
    if not isinstance(seed, int):
        raise ValueError(f"{world / 'world.json'} records no integer config.seed; regenerate the world")
    gallery = read_jsonl(base / "gallery.jsonl", required=("id", "image", "scene"))
    scenes = {str(g["id"]): Scene.from_dict(g["scene"]) for g in gallery}
    queries = []
    for q in read_jsonl(base / "queries.jsonl", required=("id", "reference", "modification", "target")):
        text, parts = describe(str(q["modification"]), scenes[str(q["target"])], share,
                               _query_rng(seed, split, str(q["id"])))
        queries.append({**q, "instruction": q["modification"], "modification": text, "described": parts})
    return gallery, queries


def generate_described(world: str | Path, share: float, splits: tuple[str, ...] = ("val", "test"),
                       force: bool = False) -> dict:
    """Writes the described protocol of each of `splits` into the world folder and returns {split: summary}.

    Refused before anything is written: a split that already holds another share, or a benchmark split left at
    another share than the one written now (val chooses slerp's alpha for test), unless `force` (the features
    extracted from the old text are then refused by their caches); and any file in the folders that foco did not
    write, unless `force`."""
    from .generate import BENCH_SPLITS, _dump_jsonl, world_fingerprint
    world, share = Path(world), float(share)
    if not (world / "world.json").is_file():
        raise FileNotFoundError(f"--world {world} holds no world.json: generate the world first "
                                "(`foco world generate`)")
    bad = [s for s in splits if s not in BENCH_SPLITS]
    if bad or not splits:
        raise ValueError(f"--split {','.join(splits)}: {', '.join(bad) or 'none'} is not a benchmark split; choose "
                         "val, test or val,test")
    if not force:
        for split in BENCH_SPLITS:
            base = world / "benchmarks" / split / "described"
            rec = _record(base)
            if rec is not None and rec["share"] != share:
                what = ("features extracted from it describe another text" if split in splits else
                        f"it would be left at another share than {', '.join(splits)} (val chooses slerp's alpha for "
                        "test): write both with --split val,test")
                raise FileExistsError(f"{base} holds the described protocol at share {rec['share']}, not {share}: "
                                      f"{what}; or pass --force to replace it (and extract its features again "
                                      "into a new folder)")
    built = {split: build_described(world, split, share) for split in splits}  # every source read before writing
    for split in splits:
        base = world / "benchmarks" / split / "described"
        check_folder(base, (RECORD,), force, flag="folder")  # "folder X holds files foco did not write ..."
        check_outputs(base, [base / f for f in (*FILES, RECORD)], force, flag="folder")
    out = {}
    for split, (gallery, queries) in built.items():
        base = world / "benchmarks" / split / "described"
        paths = [base / f for f in (*FILES, RECORD)]
        claim_folder(base, "world describe", (RECORD,), force=True)
        record_outputs(base, paths)  # foco's before they are written: an interrupted run is resumed, not refused
        _dump_jsonl(base / "gallery.jsonl", gallery)
        _dump_jsonl(base / "queries.jsonl", queries)
        single = world / "benchmarks" / split / "single"
        n_named = [len(q["described"]) for q in queries]
        scenes = {g["id"]: g["scene"] for g in gallery}
        n_parts = sum(len(scenes[q["target"]]["objects"]) + 1 for q in queries)  # objects + the background
        summary = {"format": FORMAT, "protocol": "described", "split": split, "share": share,
                   "world": world_fingerprint(world), "queries": len(queries), "gallery": len(gallery),
                   "components_named": round(sum(n_named) / max(n_parts, 1), 4),
                   "instruction_only": sum(1 for n in n_named if n == 0),
                   "single_sha256": {f: sha256_file(single / f) for f in FILES},
                   "manifests_sha256": {f: sha256_file(base / f) for f in FILES}}
        atomic_write_text(base / RECORD, json.dumps(summary, indent=2, sort_keys=True) + "\n")
        out[split] = summary
    return out
