"""Captions of world scenes and their ground-truth decomposition into (local, context) pairs.

A caption names every object ("a large red circle") and the background ("on a beach"); it never says where an
object is. The oracle decomposition has one pair per object and one for the background (paper §3.1): the local
caption is the phrase for that component, and the contextual caption is the same sentence without it.
"""
from __future__ import annotations

import numpy as np

from ..decompose.schema import Decomposition, LocalContextPair
from .scene import Scene, WorldObject
from .vocab import BACKGROUNDS

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
# The sentence when no object remains (contextual caption of a one-object scene's object).
EMPTY_TEMPLATE = "an empty scene {bg}"


def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def object_phrase(obj: WorldObject) -> str:
    """ "a large red circle"; stamps have no colour word: "a small cat". """
    words = [obj.size] + ([obj.colour] if obj.colour else []) + [obj.kind]
    return article(" ".join(words))


def join_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def render_caption(object_phrases: list[str], bg_phrase: str | None, template: int) -> str:
    """One sentence from a template. With no background phrase, only the object list remains."""
    if bg_phrase is None:
        return join_list(object_phrases)
    if not object_phrases:
        return EMPTY_TEMPLATE.format(bg=bg_phrase)
    t = TEMPLATES[template]
    return t.format(objs=join_list(object_phrases), bg=bg_phrase, Bg=bg_phrase[0].upper() + bg_phrase[1:],
                    be="is" if len(object_phrases) == 1 else "are")


class CaptionChoice:
    """The random choices behind one caption: template, object order and background phrase."""

    def __init__(self, rng: np.random.Generator, scene: Scene):
        self.template = int(rng.integers(len(TEMPLATES)))
        self.order = [int(i) for i in rng.permutation(len(scene.objects))]
        phrases = BACKGROUNDS[scene.background]["phrases"]
        self.bg_phrase = phrases[int(rng.integers(len(phrases)))]


def caption_scene(scene: Scene, choice: CaptionChoice) -> tuple[str, Decomposition, list[str]]:
    """Returns the caption, its oracle decomposition, and what each pair grounds ("object:<i>" / "background")."""
    phrases = [object_phrase(scene.objects[i]) for i in choice.order]
    caption = render_caption(phrases, choice.bg_phrase, choice.template)
    pairs, grounds = [], []
    for pos, i in enumerate(choice.order):
        rest = phrases[:pos] + phrases[pos + 1:]
        pairs.append(LocalContextPair(local=phrases[pos], context=render_caption(rest, choice.bg_phrase,
                                                                                    choice.template)))
        grounds.append(f"object:{i}")
    pairs.append(LocalContextPair(local=BACKGROUNDS[scene.background]["noun"],
                                  context=render_caption(phrases, None, choice.template)))
    grounds.append("background")
    return caption, Decomposition(caption=caption, pairs=pairs, decomposer={"name": "oracle"}), grounds
