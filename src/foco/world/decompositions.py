"""World pairs joined with decompositions from a store (what `foco train` and the feature cache read)."""
from __future__ import annotations

import logging
from pathlib import Path

from .manifest import load_pairs
from ..decompose.schema import Decomposition
from ..decompose.store import stored_decompositions

log = logging.getLogger(__name__)


def world_decompositions(world: str | Path, split: str, store: str | Path | None = None,
                         decomposer: str = "oracle", max_fallback: float = 0.01) -> dict[str, Decomposition]:
    """image id -> Decomposition of its caption. Without a store, the world's own oracle decompositions.

    Rows a fallback wrote (flagged: the LLM failed and the rule decomposer answered) are counted: more than
    `max_fallback` of the captions is refused, so that "llm" never trains on rule pairs without a word; fewer are
    logged."""
    pairs = load_pairs(world, split)
    if store is None:
        if decomposer != "oracle":
            raise ValueError(f"decomposer {decomposer!r} needs --decompositions STORE (run `foco decompose`)")
        return {p.id: p.decomposition for p in pairs}
    return stored_decompositions([(p.id, p.caption) for p in pairs], store, decomposer, max_fallback, f"{split} ")
