"""Captions of world scenes and their ground-truth decomposition into (local, context) pairs.

A caption names objects ("a large red circle") and the background ("on a beach"); it never says where an object
is. Like real alt-text, a caption may be partial: with `partial=True` it can leave out some objects or the
background (what it leaves out is still in the image). The oracle decomposition has one pair per mentioned object
and one for the background if mentioned (paper §3.1): the local caption is the phrase for that component, and the
contextual caption is the same sentence without it.
"""
from __future__ import annotations

import numpy as np

from ..decompose.schema import Decomposition, LocalContextPair
from .scene import Scene, WorldObject
from .vocab import BACKGROUNDS, MARK_PHRASES

# Sentence templates: {objs} is an object list, {bg} a background phrase. The first letter is capitalised
# only by template 2, whose sentence starts with the background.
TEMPLATES: tuple[str, ...] = (
    "{objs} {bg}",
    "a picture of {objs} {bg}",
    "{Bg}, there {be} {objs}",
    "a scene {bg} with {objs}",
    "{objs} can be seen {bg}",
    "a photo showing {objs} {bg}",
)
# The same templates for a caption that does not mention the background.
TEMPLATES_NO_BG: tuple[str, ...] = (
    "{objs}",
    "a picture of {objs}",
    "there {be} {objs}",
    "a scene with {objs}",
    "{objs} can be seen",
    "a photo showing {objs}",
)
# The sentence when no object remains (contextual caption of a one-object scene's object).
EMPTY_TEMPLATE = "an empty scene {bg}"
PARTIAL_OBJECTS_PROB = 0.4  # chance that a partial caption leaves out at least one object (when there are 2+)
NO_BACKGROUND_PROB = 0.2  # chance that a partial caption leaves out the background (when it names 2+ objects)


def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def object_phrase(obj: WorldObject, name_mark: bool = False) -> str:
    """ "a large red circle"; stamps have no colour word: "a small cat". With `name_mark`, a marked shape's mark
    follows: "a large red circle with a ring" (pretraining captions only, `WorldConfig.mark_captions`)."""
    words = [obj.size] + ([obj.colour] if obj.colour else []) + [obj.kind]
    phrase = article(" ".join(words))
    return f"{phrase} with {MARK_PHRASES[obj.mark]}" if name_mark and obj.mark is not None else phrase


def join_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def render_caption(object_phrases: list[str], bg_phrase: str | None, template: int) -> str:
    """One sentence from a template. With no background phrase, only the object list remains."""
    be = "is" if len(object_phrases) == 1 else "are"
    if bg_phrase is None:
        if not object_phrases:  # the context of a detail caption's one shape (issue 56); no other caption has it
            return EMPTY_TEMPLATE.split(" {bg}")[0]
        return TEMPLATES_NO_BG[template].format(objs=join_list(object_phrases), be=be)
    if not object_phrases:
        return EMPTY_TEMPLATE.format(bg=bg_phrase)
    return TEMPLATES[template].format(objs=join_list(object_phrases), bg=bg_phrase,
                                      Bg=bg_phrase[0].upper() + bg_phrase[1:], be=be)


class CaptionChoice:
    """The random choices behind one caption: template, which objects it mentions and in what order, and the
    background phrase (None when the caption leaves the background out)."""

    def __init__(self, rng: np.random.Generator, scene: Scene, partial: bool = False):
        self.template = int(rng.integers(len(TEMPLATES)))
        self.order = [int(i) for i in rng.permutation(len(scene.objects))]
        phrases = BACKGROUNDS[scene.background]["phrases"]
        self.bg_phrase: str | None = phrases[int(rng.integers(len(phrases)))]
        if partial:
            u_objects, u_bg = rng.random(), rng.random()
            if len(self.order) >= 2 and u_objects < PARTIAL_OBJECTS_PROB:
                keep = int(rng.integers(1, len(self.order)))
                self.order = self.order[:keep]
            if len(self.order) >= 2 and u_bg < NO_BACKGROUND_PROB:
                self.bg_phrase = None


def caption_scene(scene: Scene, choice: CaptionChoice, name_marks: bool = False
                  ) -> tuple[str, Decomposition, list[str]]:
    """Returns the caption, its oracle decomposition, and what each pair grounds ("object:<i>" / "background").
    With `name_marks`, every mentioned shape that carries a mark is named with it."""
    phrases = [object_phrase(scene.objects[i], name_marks) for i in choice.order]
    caption = render_caption(phrases, choice.bg_phrase, choice.template)
    pairs, grounds = [], []
    for pos, i in enumerate(choice.order):
        rest = phrases[:pos] + phrases[pos + 1:]
        pairs.append(LocalContextPair(local=phrases[pos], context=render_caption(rest, choice.bg_phrase,
                                                                                    choice.template)))
        grounds.append(f"object:{i}")
    if choice.bg_phrase is not None:
        pairs.append(LocalContextPair(local=BACKGROUNDS[scene.background]["noun"],
                                      context=render_caption(phrases, None, 0)))
        grounds.append("background")
    return caption, Decomposition(caption=caption, pairs=pairs, decomposer={"name": "oracle"}), grounds
