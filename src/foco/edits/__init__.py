"""Edit supervision written from captions: image-text-text (ITT) triplets (PACT) derived from caption
decompositions alone, with an instruction writer, into a resumable store.

    decompositions -> derive (remove / replace / attribute / add, negatives) -> writer (instruction) -> store

Nothing here reads a benchmark or the embedded world's edit sampler and phrasings (tests/test_edits.py checks the
imports): the same generator serves a CC3M-style corpus and the world's training captions.
"""
from __future__ import annotations

from ..registry import Registry

WRITERS = Registry("edit writer")
WRITERS.register("rule", "foco.edits.rule:RuleWriter")

__all__ = ["WRITERS"]
