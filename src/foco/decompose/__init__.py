"""Caption decomposition (paper §3.1): captions -> (local, context) pairs, by `oracle`, `rule` or `llm`, into a
resumable SQLite store that training reads.

    captions (inputs) -> decomposer (oracle | rule | llm) -> store -> training
"""
from ..registry import Registry
from .schema import (Decomposer, DecomposerOptions, Decomposition, LocalContextPair, caption_hash,
                     settings_id)
from .store import DecompositionStore, StoreError

__all__ = ["Decomposer", "Decomposition", "LocalContextPair", "caption_hash", "settings_id",
           "DecompositionStore", "StoreError", "DECOMPOSERS", "DecomposerOptions", "build_decomposer"]


DECOMPOSERS = Registry("decomposer")
DECOMPOSERS.register("oracle", "foco.decompose.oracle:OracleDecomposer")
DECOMPOSERS.register("rule", "foco.decompose.rule:RuleDecomposer")
DECOMPOSERS.register("llm", "foco.decompose.llm:LLMDecomposer")


def build_decomposer(name: str, records=None, llm=None, max_pairs: int = 5) -> Decomposer:
    """The decomposer registered as `name`: `oracle` needs the input records' ground truth; `llm` an LLMConfig."""
    return DECOMPOSERS.get(name).from_options(DecomposerOptions(records, llm, max_pairs))
