"""World pairs joined with decompositions from a store (what `foco train` and the feature cache read)."""
from __future__ import annotations

import logging
from pathlib import Path

from .manifest import load_pairs
from ..decompose.schema import Decomposition
from ..decompose.store import DecompositionStore

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
    if not Path(store).is_file():
        raise FileNotFoundError(f"decomposition store not found: {store} (run `foco decompose --out {store}`)")
    with DecompositionStore(store) as s:
        found = s.get_many(s.resolve(decomposer), [p.caption for p in pairs])
    flagged = sum(1 for p in pairs if found[p.caption].flag)
    if flagged > max_fallback * len(pairs):
        raise ValueError(f"{flagged} of {len(pairs)} {split} captions in {store} ({decomposer}) were written by a "
                         f"fallback, more than --max-fallback {max_fallback:g}: ask again with `foco decompose ... "
                         "--retry-flagged`, or raise --max-fallback")
    if flagged:
        log.warning("%d of %d %s captions in %s (%s) were written by a fallback", flagged, len(pairs), split, store,
                    decomposer)
    return {p.id: found[p.caption] for p in pairs}
