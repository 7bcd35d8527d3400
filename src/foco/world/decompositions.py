"""World pairs joined with decompositions from a store (what `foco train` and the feature cache read)."""
from __future__ import annotations

from pathlib import Path

from .manifest import load_pairs
from ..decompose.schema import Decomposition
from ..decompose.store import DecompositionStore


def world_decompositions(world: str | Path, split: str, store: str | Path | None = None,
                         decomposer: str = "oracle") -> dict[str, Decomposition]:
    """image id -> Decomposition of its caption. Without a store, the world's own oracle decompositions."""
    pairs = load_pairs(world, split)
    if store is None:
        if decomposer != "oracle":
            raise ValueError(f"decomposer {decomposer!r} needs --decompositions STORE (run `foco decompose`)")
        return {p.id: p.decomposition for p in pairs}
    if not Path(store).is_file():
        raise FileNotFoundError(f"decomposition store not found: {store} (run `foco decompose --out {store}`)")
    with DecompositionStore(store) as s:
        found = s.get_many(s.resolve(decomposer), [p.caption for p in pairs])
    return {p.id: found[p.caption] for p in pairs}
