"""Is a retrieved target image right? The world's manifests tell (TSCIR's target retrieval, reported on the world).

Two readings, both counted:
* right (exact): the edit is read back into the source scene (its provenance names the phrase it changed and the
  phrase or word it put in, which the world's vocabulary parses into (kind, colour, size) or a background), and the
  retrieved scene has exactly the edited scene's objects (a multiset; places are never described) and background.
  A corpus of N random scenes rarely holds that exact scene.
* fits the caption: the retrieved scene holds every object the target caption names (a multiset) and the setting
  it names, if any; what the caption leaves out is free, as it is for a partial caption.
Edits whose phrases the vocabulary cannot parse are counted as unparsed, never as right.
"""
from __future__ import annotations

import re
from collections import Counter

from .scene import Scene
from .vocab import BACKGROUNDS, COLOURS, SIZES

_OBJ = re.compile(r"\b(" + "|".join(SIZES) + r")\s+(?:(" + "|".join(COLOURS) + r")\s+)?([a-z]+)\b")


def _background(phrase: str) -> str | None:
    p = phrase.lower()
    for name, spec in BACKGROUNDS.items():
        words = (name, spec["noun"], *spec["phrases"])
        if any(re.search(r"(?<!\w)" + re.escape(w) + r"(?!\w)", p) for w in words):
            return name
    return None


def _object(phrase: str) -> tuple[str, str, str] | None:
    m = _OBJ.search(phrase.lower())
    return None if m is None else (m.group(3), m.group(2) or "", m.group(1))


def edited_scene(source: Scene, record: dict) -> tuple[str, Counter] | None:
    """(background, object multiset) the triplet's edit asks for, or None when its phrases do not parse."""
    prov, kind = record["provenance"], record["kind"]
    bg, objs = source.background, Counter(o.semantic for o in source.objects)
    phrase = prov.get("phrase", "")
    if kind == "add":
        new = _object(prov.get("new", ""))
        if new is None:
            return None
        objs[new] += 1
        return bg, objs
    if _background(phrase) and _object(phrase) is None:  # a setting
        if kind == "replace":
            new_bg = _background(prov.get("new", ""))
            return None if new_bg is None else (new_bg, objs)
        return None  # removing a background has no one right image
    old = _object(phrase)
    if old is None or objs[old] == 0:
        return None
    objs[old] -= 1
    if kind == "remove":
        return bg, +objs
    if kind == "replace":
        new = _object(prov.get("new", ""))
    elif kind == "attribute":
        new = _object(phrase.replace(prov.get("old", ""), prov.get("new", ""), 1))
    else:
        return None
    if new is None:
        return None
    objs[new] += 1
    return bg, +objs


def fits_caption(scene: Scene, caption: str) -> bool:
    """Every object and the setting `caption` names are in `scene`."""
    named = Counter((k, c or "", s) for s, c, k in _OBJ.findall(caption.lower()))
    have = Counter(o.semantic for o in scene.objects)
    bg = _background(caption)
    return all(have[o] >= n for o, n in named.items()) and (bg is None or bg == scene.background)


def check_targets(records: list[dict], sources: list[Scene], retrieved: list[Scene | None]) -> dict:
    """Counts per kind: triplets, retrieved (kept an image), fits (the image fits the target caption), parsed,
    right (exactly the edited scene). `retrieved[t]` is None when the triplet kept no image."""
    out: dict[str, Counter] = {}
    for rec, src, got in zip(records, sources, retrieved):
        c = out.setdefault(rec["kind"], Counter())
        c["triplets"] += 1
        if got is None:
            continue
        c["retrieved"] += 1
        c["fits"] += int(fits_caption(got, rec["target_caption"]))
        want = edited_scene(src, rec)
        if want is None:
            continue
        c["parsed"] += 1
        c["right"] += int(got.background == want[0] and Counter(o.semantic for o in got.objects) == want[1])
    return {k: dict(v) for k, v in out.items()}
