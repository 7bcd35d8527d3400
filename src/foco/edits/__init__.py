"""Edit supervision written from captions: image-text-text (ITT) triplets (PACT) derived from caption
decompositions alone, with an instruction writer, into a resumable store.

    decompositions -> derive (remove / replace / attribute / add, negatives) -> writer (instruction) -> store

Nothing here reads a benchmark or the embedded world's edit sampler and phrasings (tests/test_edits.py checks the
imports): the same generator serves a CC3M-style corpus and the world's training captions.
"""
from __future__ import annotations

from ..registry import Registry
from .schema import WriterOptions

WRITERS = Registry("edit writer")
WRITERS.register("rule", "foco.edits.rule:RuleWriter")
WRITERS.register("llm", "foco.edits.llm:LLMWriter")



def build_writer(name: str, opts: WriterOptions | None = None):
    """The writer registered as `name` (rule, llm)."""
    return WRITERS.get(name).from_options(opts or WriterOptions())


__all__ = ["WRITERS", "WriterOptions", "build_writer"]
