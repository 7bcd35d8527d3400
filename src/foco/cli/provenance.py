"""What each input a command declares (`foco.cli.rules`) was made from, and the runner's checks across them: one
world per command, a trained model kept away from the split it was trained on, a rerun into an output made from
the same inputs. The backbone is checked where it is used (`foco.backbones.check_same_backbone`), by every
consumer; a reader here never fails on a damaged file: the command reading it says what is wrong."""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Callable

WEIGHT_RECORDS = ("foco.json", "pic2word.json", "lincir.json", "searle.json", "context_i2w.json", "composer.json", "adafocal.json")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _world(path: Path) -> dict:
    from ..world.generate import world_fingerprint
    try:
        fp = world_fingerprint(path)
    except (OSError, ValueError):
        return {}
    return {"worlds": [fp]} if fp else {}


def _cache(path: Path) -> dict:
    source = _json(path / "manifest.json").get("source")
    if not isinstance(source, dict) or not isinstance(source.get("world"), str):
        return {}
    return {"worlds": [source["world"]], "split": source.get("split")}


def _caches(path: Path) -> dict:
    """A folder of caches (`foco eval --features`), or one cache."""
    if (path / "manifest.json").is_file():
        return _cache(path)
    worlds: dict[str, str] = {}
    for child in sorted(path.iterdir()) if path.is_dir() else []:
        w = _cache(child).get("worlds")
        if w:
            worlds.setdefault(w[0], child.name)
    return {"worlds": sorted(worlds), "where": worlds} if worlds else {}


def _edit_store(path: Path) -> dict:
    import sqlite3
    if not path.is_file():
        return {}
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT json FROM runs").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    worlds = set()
    for (run,) in rows:
        try:
            w = ((json.loads(run) or {}).get("source") or {}).get("world")
        except (ValueError, AttributeError, TypeError):
            w = None
        if isinstance(w, str):
            worlds.add(w)
    return {"worlds": sorted(worlds)} if worlds else {}


def _weights(path: Path) -> dict:
    """A trained method's folder: the world and split its training features came from (`trained_on`)."""
    for name in WEIGHT_RECORDS:
        meta = _json(path / name)
        prov = meta.get("provenance")
        features = prov.get("features") if isinstance(prov, dict) else None
        source = features.get("source") if isinstance(features, dict) else None
        if isinstance(source, dict) and isinstance(source.get("world"), str) and isinstance(source.get("split"), str):
            return {"trained_on": {"world": source["world"], "split": source["split"]}}
    return {}


READERS: dict[str, Callable[[Path], dict]] = {
    "world": _world, "benchmark root": _world, "feature cache": _cache, "feature caches": _caches,
    "edit store": _edit_store, "weights": _weights}


NOUNS = {"world": "the world", "benchmark root": "the world", "feature cache": "features",
         "feature caches": "features", "edit store": "edit triplets", "weights": "weights"}


def inputs_of(a: argparse.Namespace, rules) -> dict[str, dict]:
    """{flag: {"path", "worlds", "split", "trained_on"}} of every declared input given, where a reader knows it."""
    got = {}
    for dest, kind, flag in rules.reads:
        value = getattr(a, dest, None)
        reader = READERS.get(kind)
        if not value or reader is None or not isinstance(value, (str, Path)):
            continue
        prov = reader(Path(value))
        if prov:
            got[flag] = {"path": str(value), "noun": NOUNS.get(kind, kind), **prov}
    return got


def check_same_world(inputs: dict[str, dict]) -> None:
    """Refuses inputs made from different worlds, naming both (a folder of caches that mixes worlds too)."""
    seen: list[tuple[str, dict, str]] = []
    for flag, prov in inputs.items():
        worlds = prov.get("worlds") or []
        if len(worlds) > 1:
            where = prov.get("where") or {}
            shown = ", ".join(f"{where.get(w, '?')} ({w})" for w in worlds[:3])
            raise ValueError(f"{flag} {prov['path']} mixes artifacts of {len(worlds)} worlds: {shown}; use one "
                             f"world's artifacts in one {flag}")
        seen += [(flag, prov, w) for w in worlds]
    votes = Counter(w for _, _, w in seen)
    if len(votes) > 1:
        top = votes.most_common()
        if top[0][1] > top[1][1]:  # most inputs agree: the odd one out is named
            major = top[0][0]
            odd = next(s for s in seen if s[2] != major)
            (sf, sp, sw), (of, op, ow) = odd, next(s for s in seen if s[2] == major)
        else:  # two disagree: the features are named (they are what another world's ids would be read from)
            first, other = seen[0], next(s for s in seen if s[2] != seen[0][2])
            (sf, sp, sw), (of, op, ow) = (first, other) if first[1]["noun"] == "features" else (other, first)
        raise ValueError(f"{sf} {sp['path']} holds {sp['noun']} of world {sw}, another world than {of} "
                         f"{op['path']} ({op['noun']} of world {ow}): one command reads one world's artifacts "
                         f"(their ids name different images); make both from the same world, or name the "
                         f"matching {sf}")


def check_split_apart(a: argparse.Namespace, rules, inputs: dict[str, dict]) -> None:
    """Refuses weights trained on the very world and split the command evaluates on."""
    if rules.evaluates is None:
        return
    world_dest, split_dest = rules.evaluates
    split = getattr(a, split_dest, None) or ("test" if getattr(a, "world", None) else "val")  # eval's defaults
    world = next((p["worlds"] for p in inputs.values() if p.get("worlds")), None)
    if not split or not world:
        return
    for flag, prov in inputs.items():
        trained = prov.get("trained_on")
        if trained and trained["world"] == world[0] and trained["split"].split("/")[0] == str(split).split("/")[0]:
            raise ValueError(f"{flag} {prov['path']} was trained on the {trained['split']} split of this world "
                             f"({world[0]}); evaluating it on --{split_dest} "
                             f"{split} scores what it saw in training: evaluate on another split, or train on "
                             "another one")


def check_rerun(a: argparse.Namespace, out, inputs: dict[str, dict]) -> None:
    """Refuses to continue an output folder made from another world than this run's inputs (a resumed trainer with
    another --world, a protocol written into another world's folder), unless the run restarts."""
    from ..utils.ownership import recorded_inputs
    folder = Path(getattr(a, out.dest))
    if not folder.is_dir() or getattr(a, "restart", False) or getattr(a, "no_resume", False):
        return
    now = {w for p in inputs.values() for w in p.get("worlds") or []}
    if not now:
        return
    made = {w for p in recorded_inputs(folder).values() if isinstance(p, dict) for w in p.get("worlds") or []}
    if not made and out.kind == "world" and "rewritten_from" not in _json(folder / "world.json"):
        made = set(_world(folder).get("worlds", []))  # another world's own folder (no inputs recorded there)
    other = sorted(made - now)
    if other:
        raise ValueError(f"{out.flag} {folder} was made from world {other[0]}, not from this run's "
                         f"({sorted(now)[0]}, {', '.join(f for f in inputs if inputs[f].get('worlds'))}): "
                         f"continuing it would mix two worlds; choose a new {out.flag}"
                         + (" or pass --restart to start it over" if hasattr(a, "restart") else ""))
