"""CIR edits of world scenes: the six edit types, their instruction phrasings, and how each changes a scene.

Modification texts are instructions ("make the circle blue"); none of their phrasings occurs in a caption. An
edit changes only what it names: other objects keep their attributes, cells and jitters.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .captions import article, object_phrase
from .scene import MAX_JITTER, Scene, WorldObject
from .vocab import BACKGROUNDS, COLOURS, SHAPES, SIZE_COMPARATIVE, SIZES

EDIT_TYPES = ("colour", "size", "replace", "add", "remove", "background")

PHRASINGS: dict[str, tuple[str, ...]] = {
    "colour": ("make the {ref} {colour}", "change the colour of the {ref} to {colour}", "the {ref} should be {colour}",
               "paint the {ref} {colour}", "turn the {ref} {colour}"),
    "size": ("make the {ref} {comparative}", "the {ref} should be {comparative}", "{verb} the {ref}",
             "{amount} the size of the {ref}"),
    "replace": ("replace the {ref} with {new}", "{new} instead of the {ref}", "swap the {ref} for {new}",
                "change the {ref} into {new}", "turn the {ref} into {new}"),
    "add": ("add {obj}", "put {obj} in the picture", "include {obj} as well", "there should also be {obj}",
            "insert {obj}"),
    "remove": ("remove the {ref}", "get rid of the {ref}", "take away the {ref}", "without the {ref}",
               "delete the {ref}"),
    "background": ("change the background to {noun}", "make the background {noun}", "set it {phrase}",
                   "move everything {phrase}", "put the scene {phrase}"),
}
_SIZE_WORDS = {"large": {"verb": "enlarge", "amount": "increase"}, "small": {"verb": "shrink", "amount": "reduce"}}


@dataclass(frozen=True)
class Edit:
    """One edit: its type, the object it targets (index into the reference's objects) and its arguments."""

    type: str
    index: int | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "index": self.index, **self.args}


def referring_expression(scene: Scene, index: int) -> str | None:
    """The shortest description that picks object `index` out of `scene` ("circle", "red circle", ...)."""
    obj = scene.objects[index]
    candidates = [[obj.kind]]
    if obj.colour:
        candidates.append([obj.colour, obj.kind])
    candidates.append([obj.size, obj.kind])
    if obj.colour:
        candidates.append([obj.size, obj.colour, obj.kind])
    for words in candidates:
        matching = [o for o in scene.objects
                    if o.kind == obj.kind and all(w in (o.kind, o.colour, o.size) for w in words)]
        if len(matching) == 1:
            return " ".join(words)
    return None


def apply_edit(scene: Scene, edit: Edit) -> Scene:
    """The scene after `edit`. Raises ValueError when the edit does not apply."""
    t, a = edit.type, edit.args
    if t == "colour":
        return scene.with_object(edit.index, colour=a["colour"])
    if t == "size":
        return scene.with_object(edit.index, size=a["size"])
    if t == "replace":
        return scene.with_object(edit.index, kind=a["kind"])
    if t == "remove":
        return Scene(scene.background, tuple(o for i, o in enumerate(scene.objects) if i != edit.index))
    if t == "add":
        obj = WorldObject(kind=a["kind"], colour=a["colour"], size=a["size"], cell=a["cell"],
                          jitter=tuple(a["jitter"]))
        if obj.cell not in scene.free_cells():
            raise ValueError("cell is occupied")
        return Scene(scene.background, tuple(sorted(scene.objects + (obj,), key=lambda o: o.cell)))
    if t == "background":
        return Scene(a["background"], scene.objects)
    raise ValueError(f"unknown edit type {t!r}")


def edit_text(scene: Scene, edit: Edit, phrasing: int) -> str:
    """The instruction for `edit` on `scene`, in phrasing number `phrasing` of its type."""
    t, a = edit.type, edit.args
    template = PHRASINGS[t][phrasing % len(PHRASINGS[t])]
    ref = referring_expression(scene, edit.index) if edit.index is not None else None
    if t == "colour":
        return template.format(ref=ref, colour=a["colour"])
    if t == "size":
        return template.format(ref=ref, comparative=SIZE_COMPARATIVE[a["size"]], **_SIZE_WORDS[a["size"]])
    if t == "replace":
        return template.format(ref=ref, new=article(a["kind"]))
    if t == "remove":
        return template.format(ref=ref)
    if t == "add":
        return template.format(obj=object_phrase(WorldObject(a["kind"], a["colour"], a["size"], a["cell"])))
    bg = BACKGROUNDS[a["background"]]
    return template.format(noun=bg["noun"], phrase=bg["phrases"][0])


def _referable(scene: Scene, shapes_only: bool = False) -> list[int]:
    return [i for i, o in enumerate(scene.objects)
            if referring_expression(scene, i) is not None and (not shapes_only or o.colour is not None)]


def applicable_types(scene: Scene) -> list[str]:
    types = []
    if _referable(scene, shapes_only=True):
        types += ["colour", "replace"]
    if _referable(scene):
        types += ["size"]
        if len(scene.objects) >= 2:
            types += ["remove"]
    if scene.free_cells():
        types += ["add"]
    types += ["background"]
    return [t for t in EDIT_TYPES if t in types]


def sample_edit(rng: np.random.Generator, scene: Scene, edit_type: str, index: int | None = None,
                exclude: dict[str, Any] | None = None) -> Edit:
    """A random edit of `edit_type` on `scene`; `index` pins the target object, `exclude` forbids argument values."""
    exclude = exclude or {}
    if edit_type in ("colour", "replace", "size", "remove") and index is None:
        pool = _referable(scene, shapes_only=edit_type in ("colour", "replace"))
        index = int(rng.choice(pool))
    obj = scene.objects[index] if index is not None else None
    if edit_type == "colour":
        choices = [c for c in COLOURS if c != obj.colour and c != exclude.get("colour")]
        return Edit("colour", index, {"colour": str(rng.choice(choices))})
    if edit_type == "size":
        return Edit("size", index, {"size": next(s for s in SIZES if s != obj.size)})
    if edit_type == "replace":
        used = {o.kind for o in scene.objects}
        choices = [k for k in SHAPES if k not in used and k != exclude.get("kind")]
        return Edit("replace", index, {"kind": str(rng.choice(choices))})
    if edit_type == "remove":
        return Edit("remove", index, {})
    if edit_type == "add":
        used = {o.kind for o in scene.objects}
        for _ in range(100):
            args = {"kind": str(rng.choice([k for k in SHAPES if k not in used])),
                    "colour": str(rng.choice(list(COLOURS))), "size": str(rng.choice(list(SIZES)))}
            if all(args[k] != exclude[k] for k in args if k in exclude):  # differs in every excluded value
                break
        args["cell"] = int(rng.choice(scene.free_cells()))
        args["jitter"] = [int(rng.integers(-MAX_JITTER, MAX_JITTER + 1)) for _ in range(2)]
        return Edit("add", None, args)
    if edit_type == "background":
        choices = [b for b in BACKGROUNDS if b != scene.background and b != exclude.get("background")]
        return Edit("background", None, {"background": str(rng.choice(choices))})
    raise ValueError(f"unknown edit type {edit_type!r}")


def hard_negative_edits(rng: np.random.Generator, scene: Scene, edit: Edit, n: int) -> list[Edit]:
    """Edits that a careless model confuses with `edit`: the right edit on the wrong object, the same object
    with another value, and other edits of the same reference."""
    out: list[Edit] = []
    t = edit.type
    # The right edit applied to the wrong object.
    if t in ("colour", "size", "remove", "replace"):
        others = [i for i in _referable(scene, shapes_only=t in ("colour", "replace")) if i != edit.index]
        for i in others:
            o = scene.objects[i]
            if t == "colour" and o.colour != edit.args["colour"]:
                out.append(Edit("colour", i, dict(edit.args)))
            elif t == "replace" and edit.args["kind"] not in {x.kind for x in scene.objects}:
                out.append(Edit("replace", i, dict(edit.args)))
            elif t == "size" and o.size != edit.args["size"]:
                out.append(Edit("size", i, dict(edit.args)))
            elif t == "remove":
                out.append(Edit("remove", i, {}))
    # The right object with another value.
    if t in ("colour", "replace", "add", "background"):
        out.append(sample_edit(rng, scene, t, edit.index, exclude=edit.args))
    # Other edits of the same reference.
    other_types = [x for x in applicable_types(scene) if x != t]
    for x in rng.permutation(other_types):
        out.append(sample_edit(rng, scene, str(x), edit.index if x in ("colour", "size", "replace", "remove")
                               and edit.index is not None and _ok(scene, edit.index, str(x)) else None))
    return out[:n]


def _ok(scene: Scene, index: int, edit_type: str) -> bool:
    if edit_type in ("colour", "replace"):
        return index in _referable(scene, shapes_only=True)
    if edit_type == "remove":
        return len(scene.objects) >= 2 and index in _referable(scene)
    return index in _referable(scene)
