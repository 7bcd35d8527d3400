"""The world's concept vocabulary and its phrases: what SEARLE's textual inversion reads in place of GPT-Neo's.

SEARLE (Baldrati et al., ICCV 2023) regularises its pseudo words with phrases about concepts: for each concept of a
vocabulary (Open Images' class names in the reference), GPT-Neo 2.7B continues "a photo of {concept} that" 256 times.
The world knows every concept its images hold, so it writes those phrases itself, in its own vocabulary: each
phrase starts "a photo of {concept} that" and goes on with what a world scene can hold (a background, a
neighbouring object, a size or colour). No language model runs, and the phrases name only things the world draws.

Concepts (`world_concepts`): every shape kind ("circle"), every colour of a shape kind ("red circle") and every
background ("beach"), in a fixed order. Stamps (cutout photos, `WorldConfig.stamps_dir`) are not concepts.
"""
from __future__ import annotations

import numpy as np

from .captions import article
from .vocab import BACKGROUNDS, COLOURS, SHAPES, SIZES

PHRASES_PER_CONCEPT = 256  # the reference's num_return_sequences


def world_concepts() -> tuple[str, ...]:
    """The world's nameable concepts: shapes, colour + shape, backgrounds (fixed order)."""
    return (tuple(SHAPES) + tuple(f"{c} {s}" for s in SHAPES for c in COLOURS)
            + tuple(BACKGROUNDS))


def _continuations(concept: str, rng: np.random.Generator) -> str:
    """One continuation of "a photo of {concept} that": what a world scene with that concept can also show."""
    shape = str(rng.choice(SHAPES))
    other = article(f"{rng.choice(list(SIZES))} {rng.choice(list(COLOURS))} {shape}")
    bg_name = str(rng.choice(list(BACKGROUNDS)))
    bg = str(rng.choice(BACKGROUNDS[bg_name]["phrases"]))
    if concept in BACKGROUNDS:  # a background: what stands on it
        return str(rng.choice([f"shows {other}", f"holds {other} and {article(shape)}", f"is behind {other}",
                               f"has {other} in front of it", "is empty", f"looks like {BACKGROUNDS[concept]['noun']}"]))
    return str(rng.choice([f"is {bg}", f"sits next to {other}", f"is {rng.choice(list(SIZES))}",
                           f"is drawn {bg} beside {other}", f"stands alone {bg}", f"is shown with {other} {bg}",
                           f"appears twice {bg}", f"is near {other}"]))


def concept_phrases(concepts: tuple[str, ...] | list[str], per_concept: int = PHRASES_PER_CONCEPT,
                    seed: int = 0) -> dict[str, list[str]]:
    """concept -> `per_concept` phrases "a photo of {concept} that ...", drawn with `seed` (the same seed, the same
    phrases). Repeats are kept, as sampling a language model 256 times keeps them."""
    rng = np.random.default_rng(seed)
    return {c: [f"a photo of {c} that {_continuations(c, rng)}" for _ in range(per_concept)] for c in concepts}


def usable_concepts(phrases: dict[str, list[str]], placeholder: str) -> set[str]:
    """The concepts SEARLE keeps: those each of whose phrases still holds the placeholder after its first mention
    of the concept is replaced (the reference's filter in oti_inversion.py and train_phi.py)."""
    return {c for c, ps in phrases.items() if all(placeholder in p.replace(c, f" {placeholder} ", 1) for p in ps)}
