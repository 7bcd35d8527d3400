"""The world benchmark with its instructions rewritten by a `foco.edits` writer (the phrasing-robustness check).

Every query's edit (type, object, arguments; kept in the benchmark's queries.jsonl) is turned into the edit schema
of `foco.edits` and handed to a writer: the rule writer's `heldout` templates, which training never sees, or the LLM
writer (a real server, not in CI). The edit says what the original instruction says: the object is named by the
same referring expression ("the red circle" when "the circle" is ambiguous), the new value by the same words.
References, targets, galleries and images are unchanged; only "modification" is rewritten (the original is kept as
"original_modification"). The output is a world folder whose `benchmarks/<split>` the evaluator reads as usual; its
images are a link to the source world's.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..edits.derive import caption_rng
from ..edits.schema import Edit
from ..utils.io import atomic_write_text, read_json, read_jsonl, sha256_file
from .captions import CaptionChoice, article, caption_scene, object_phrase
from .edits import referring_expression
from .scene import Scene, WorldObject
from .vocab import BACKGROUNDS

PROTOCOLS = ("single", "multi")


def as_edit(scene: Scene, edit: dict) -> Edit:
    """A world benchmark edit ({"type", "index", args}) on `scene` as a `foco.edits.schema.Edit`."""
    t, i = edit["type"], edit.get("index")
    ref = referring_expression(scene, i) if i is not None else None
    if t == "colour":
        return Edit("attribute", f"the {ref}", new=edit["colour"], old=scene.objects[i].colour or "", head=ref)
    if t == "size":
        return Edit("attribute", f"the {ref}", new=edit["size"], old=scene.objects[i].size, head=ref)
    if t == "replace":
        return Edit("replace", f"the {ref}", new=article(edit["kind"]))
    if t == "remove":
        return Edit("remove", f"the {ref}")
    if t == "add":
        return Edit("add", "", new=object_phrase(WorldObject(edit["kind"], edit["colour"], edit["size"], edit["cell"])))
    if t == "background":
        return Edit("replace", "the background", new=BACKGROUNDS[edit["background"]]["noun"])
    raise ValueError(f"unknown world edit type {t!r}")


def rewrite_benchmark(root: str | Path, split: str, out: str | Path, writer, seed: int = 0) -> dict[str, int]:
    """Writes `out`/benchmarks/`split`/{single,multi} with every query's instruction rewritten by `writer`."""
    root, out = Path(root).resolve(), Path(out)
    if out.resolve() == root:
        raise ValueError(f"--out {out} is the source world; choose another folder")
    counts = {}
    for protocol in PROTOCOLS:
        base = root / "benchmarks" / split / protocol
        if not base.is_dir():
            continue
        gallery = {str(g["id"]): Scene.from_dict(g["scene"])
                   for g in read_jsonl(base / "gallery.jsonl", required=("id", "scene"))}
        queries = read_jsonl(base / "queries.jsonl", required=("id", "reference", "modification", "edit"))
        items = []
        for q in queries:
            scene = gallery[q["reference"]]
            rng = caption_rng(seed, str(q["id"]))
            caption = caption_scene(scene, CaptionChoice(np.random.default_rng(rng.integers(2 ** 32)), scene))[0]
            items.append((caption, [as_edit(scene, q["edit"])], rng))
        written = writer.write_batch(items)
        lines = []
        for q, w in zip(queries, written):
            instruction, _, flag = w[0]
            lines.append(json.dumps({**q, "modification": instruction, "original_modification": q["modification"],
                                     **({"rewrite_flag": flag} if flag else {})}))
        dest = out / "benchmarks" / split / protocol
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(base / "gallery.jsonl", dest / "gallery.jsonl")
        atomic_write_text(dest / "queries.jsonl", "\n".join(lines) + "\n")
        counts[protocol] = len(lines)
    if not counts:
        raise FileNotFoundError(f"no benchmark split {split!r} under {root / 'benchmarks'}")
    if not (out / "images").exists():
        os.symlink(root / "images", out / "images", target_is_directory=True)
    if (root / "world.json").is_file():  # the source's config; counts and hashes of the files this folder holds
        summary = read_json(root / "world.json")
        held = {name: n for name, n in (summary.get("counts") or {}).items() if (out / name).is_file()}
        for protocol, n in counts.items():
            held[f"benchmarks/{split}/{protocol}/queries.jsonl"] = n
        summary["counts"] = held
        summary["manifests_sha256"] = {name: sha256_file(out / name) for name in held}
        summary["rewritten_from"] = str(root)
        atomic_write_text(out / "world.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return counts
