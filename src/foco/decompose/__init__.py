"""Caption decomposition (paper §3.1): captions -> (local, context) pairs, by `oracle`, `rule` or `llm`, into a
resumable SQLite store that training reads.

    captions (inputs) -> decomposer (oracle | rule | llm) -> store -> training
"""
from .schema import Decomposer, Decomposition, LocalContextPair, caption_hash, settings_id
from .store import DecompositionStore, StoreError

__all__ = ["Decomposer", "Decomposition", "LocalContextPair", "caption_hash", "settings_id",
           "DecompositionStore", "StoreError", "build_decomposer"]


def build_decomposer(name: str, records=None, llm=None, max_pairs: int = 5):
    """`oracle` needs the input records' ground truth; `llm` an LLMConfig."""
    if name == "oracle":
        from .oracle import OracleDecomposer
        truth = {r.caption: r.truth for r in (records or []) if r.truth is not None}
        if records is not None and len(truth) < len({r.caption for r in records}):
            raise ValueError("the oracle decomposer needs inputs that carry their decomposition "
                             "(a world folder or its pairs JSONL)")
        return OracleDecomposer(truth)
    if name == "rule":
        from .rule import RuleDecomposer
        return RuleDecomposer(max_pairs=max_pairs)
    if name == "llm":
        from .llm import LLMConfig, LLMDecomposer
        return LLMDecomposer(llm or LLMConfig())
    raise ValueError(f"unknown decomposer {name!r}; choose oracle, rule or llm")
