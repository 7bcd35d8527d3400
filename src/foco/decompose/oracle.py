"""The `oracle` decomposer: the world's ground-truth decompositions, looked up by caption."""
from __future__ import annotations

from typing import Any

from .schema import DecomposerOptions, Decomposition


class OracleDecomposer:
    def __init__(self, truth: dict[str, Decomposition]):
        self.truth = truth
        self.settings: dict[str, Any] = {"name": "oracle"}

    @classmethod
    def from_options(cls, opts: DecomposerOptions) -> "OracleDecomposer":
        records = opts.records
        truth = {r.caption: r.truth for r in (records or []) if r.truth is not None}
        if records is not None and len(truth) < len({r.caption for r in records}):
            raise ValueError("the oracle decomposer needs inputs that carry their decomposition "
                             "(a world folder or its pairs JSONL)")
        return cls(truth)

    def decompose_batch(self, captions: list[str]) -> list[Decomposition]:
        unknown = [c for c in captions if c not in self.truth]
        if unknown:
            raise ValueError(f"the oracle knows only the world's own captions; {len(unknown)} unknown, "
                           f"e.g. {unknown[0]!r}")
        return [Decomposition(c, list(self.truth[c].pairs), dict(self.settings)) for c in captions]
