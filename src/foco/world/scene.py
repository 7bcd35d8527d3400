"""Scene specifications: what is in a world image, independent of how it is drawn or described."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .vocab import BACKGROUNDS, COLOURS, GRID, MAX_OBJECTS, SHAPES, SIZES


@dataclass(frozen=True)
class WorldObject:
    """One object of a scene.

    Attributes:
        kind: a shape name from `SHAPES`, or the noun of a stamp (e.g. "cat").
        colour: a colour name from `COLOURS`; None for stamps, which keep their photo colours.
        size: "small" or "large".
        cell: the layout cell, 0 .. GRID*GRID-1, row-major.
        jitter: offset (dx, dy) of the object centre inside its cell, in pixels of the final image.
        stamp: path of the stamp image relative to the stamps folder, or None for a procedural shape.
        mark: an instance mark from `MARKS` drawn inside a procedural shape (the OACIR protocol, `oacir.py`), or
            None (the world's own objects: none, but for `--pretrain-marks`). Only pretraining detail captions name it.
    """

    kind: str
    colour: str | None
    size: str
    cell: int
    jitter: tuple[int, int] = (0, 0)
    stamp: str | None = None
    mark: str | None = None

    @property
    def semantic(self) -> tuple[str, str, str]:
        """What a caption says about the object (its place is never described)."""
        return (self.kind, self.colour or "", self.size)

    @property
    def instance(self) -> tuple[str, str, str, str]:
        """What tells two objects apart as instances: (kind, colour, size, mark), "" for an absent value."""
        return (self.kind, self.colour or "", self.size, self.mark or "")


@dataclass(frozen=True)
class Scene:
    background: str
    objects: tuple[WorldObject, ...] = field(default_factory=tuple)

    def semantic_key(self) -> tuple:
        """Equal for two scenes exactly when every caption and edit text treats them alike."""
        return (self.background, tuple(sorted(o.semantic for o in self.objects)))

    def layout_key(self) -> tuple:
        """Equal for two scenes exactly when they render to the same image."""
        # an object's mark is part of the key only when it has one: the world's own keys are unchanged
        return (self.background, tuple(sorted((o.cell, o.jitter, o.semantic, o.stamp)
                                              + ((o.mark,) if o.mark is not None else ()) for o in self.objects)))

    def without_marks(self) -> "Scene":
        """The scene with every instance mark taken off: the scene a marked pretraining scene was drawn as."""
        return Scene(self.background, tuple(replace(o, mark=None) for o in self.objects))

    def taken_layouts(self, pairs: bool) -> set:
        """The layouts this scene keeps other protocols from drawing: its own, and for a pairs scene also its unmarked
        one (a marked pretraining scene was drawn unmarked, `--pretrain-marks`)."""
        return {self.layout_key(), self.without_marks().layout_key()} if pairs else {self.layout_key()}

    def free_cells(self) -> list[int]:
        used = {o.cell for o in self.objects}
        return [c for c in range(GRID * GRID) if c not in used]

    def to_dict(self) -> dict[str, Any]:
        # "mark" is written only when set, so a scene without marks gives the dict (and the bytes) it always did
        return {"background": self.background,
                "objects": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(o).items()
                             if not (k == "mark" and v is None)} for o in self.objects]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Scene":
        objs = tuple(WorldObject(kind=o["kind"], colour=o["colour"], size=o["size"], cell=int(o["cell"]),
                                 jitter=(int(o["jitter"][0]), int(o["jitter"][1])), stamp=o.get("stamp"),
                                 mark=o.get("mark"))
                     for o in d["objects"])
        return Scene(background=d["background"], objects=objs)

    def with_object(self, index: int, **changes: Any) -> "Scene":
        objs = list(self.objects)
        objs[index] = replace(objs[index], **changes)
        return Scene(self.background, tuple(objs))


@dataclass(frozen=True)
class Stamp:
    """A captioned cutout photo: `path` relative to the stamps folder, `kind` the noun its caption gives."""

    path: str
    kind: str


# How many objects a scene holds: 1 .. 4 with these weights.
OBJECT_COUNT_WEIGHTS = (0.15, 0.3, 0.3, 0.25)
MAX_JITTER = 4  # pixels


def sample_object(rng: np.random.Generator, cell: int, stamps: list[Stamp], stamp_prob: float) -> WorldObject:
    size = str(rng.choice(list(SIZES)))
    jitter = (int(rng.integers(-MAX_JITTER, MAX_JITTER + 1)), int(rng.integers(-MAX_JITTER, MAX_JITTER + 1)))
    if stamps and rng.random() < stamp_prob:
        st = stamps[int(rng.integers(len(stamps)))]
        return WorldObject(kind=st.kind, colour=None, size=size, cell=cell, jitter=jitter, stamp=st.path)
    return WorldObject(kind=str(rng.choice(SHAPES)), colour=str(rng.choice(list(COLOURS))), size=size,
                       cell=cell, jitter=jitter)


def sample_scene(rng: np.random.Generator, stamps: list[Stamp] = (), stamp_prob: float = 0.0,
                 n_objects: int | None = None) -> Scene:
    """Draws a background and 1-4 objects in distinct cells."""
    if n_objects is None:
        n_objects = int(rng.choice(np.arange(1, MAX_OBJECTS + 1), p=np.array(OBJECT_COUNT_WEIGHTS)))
    cells = rng.permutation(GRID * GRID)[:n_objects]
    objs = tuple(sample_object(rng, int(c), list(stamps), stamp_prob) for c in sorted(cells))
    return Scene(background=str(rng.choice(list(BACKGROUNDS))), objects=objs)


def relayout(scene: Scene, rng: np.random.Generator) -> Scene:
    """The same objects at other cells and jitters: a scene no caption or edit can tell apart."""
    cells = rng.permutation(GRID * GRID)[: len(scene.objects)]
    objs = tuple(replace(o, cell=int(c), jitter=(int(rng.integers(-MAX_JITTER, MAX_JITTER + 1)),
                                                 int(rng.integers(-MAX_JITTER, MAX_JITTER + 1))))
                 for o, c in zip(scene.objects, cells))
    return Scene(scene.background, tuple(sorted(objs, key=lambda o: o.cell)))
