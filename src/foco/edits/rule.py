"""The `rule` writer: an instruction for each derived edit from templates of its own, written for general English
captions (not for the embedded world; the world benchmark's phrasings are not used and are not imported).

Two template sets: `train` (what the generator writes) and `heldout` (a second set that training never sees, for the
phrasing-robustness check). The template is drawn per edit with the caption's own generator.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from .schema import Edit, WriterOptions

TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "remove": ("erase {x}", "leave out {x}", "drop {x} from the scene", "{x} should be gone",
                   "the same picture with no {x_bare}"),
        "replace": ("exchange {x} for {y}", "have {y} in place of {x}", "{x} becomes {y}", "use {y} rather than {x}",
                    "substitute {y} for {x}"),
        "attribute": ("let the {head} be {b}", "switch the {head} from {a} to {b}", "a {b} {head}, not a {a} one",
                      "same scene, but the {head} is {b}", "{a} to {b}"),
        "add": ("also put {y} there", "the same with {y} added", "{y} appears too", "throw in {y}",
                "extend the scene with {y}"),
    },
    "heldout": {
        "remove": ("could you take {x} out", "i don't want {x} in it", "lose {x}"),
        "replace": ("i'd like {y} where {x} is", "trade {x} for {y}", "show {y}, not {x}"),
        "attribute": ("i want the {head} {b}", "give the {head} a {b} look", "{b} {head} please"),
        "add": ("could you add {y} too", "i'd like {y} in it as well", "bring in {y}"),
    },
}
_ARTICLE = re.compile(r"^(a|an|one|some)\s+", re.I)


def definite(phrase: str) -> str:
    """"a red circle" -> "the red circle"; phrases with their own determiner stay as they are."""
    return _ARTICLE.sub("the ", phrase.strip(), count=1)


class RuleWriter:
    """One template per edit, filled with the edit's phrases, drawn with the caption's own generator."""

    def __init__(self, templates: str = "train"):
        if templates not in TEMPLATES:
            raise ValueError(f"unknown template set {templates!r}; choose from {', '.join(TEMPLATES)}")
        self.templates = TEMPLATES[templates]
        self.settings: dict[str, Any] = {"name": "rule", "templates": templates}

    @classmethod
    def from_options(cls, opts: WriterOptions) -> "RuleWriter":
        return cls(opts.templates)

    def instruction(self, edit: Edit, rng: np.random.Generator) -> str:
        options = self.templates[edit.kind]
        template = options[int(rng.integers(len(options)))]
        bare = _ARTICLE.sub("", edit.phrase.strip(), count=1)
        return template.format(x=definite(edit.phrase), x_bare=bare, y=edit.new, head=edit.head, a=edit.old,
                               b=edit.new)

    def write_batch(self, items: list[tuple[str, list[Edit], np.random.Generator]]) -> list[list[tuple[str, str, str]]]:
        """(instruction, target caption, flag) for each edit of each (caption, edits, generator)."""
        return [[(self.instruction(e, rng), e.target, "") for e in edits] for _, edits, rng in items]
