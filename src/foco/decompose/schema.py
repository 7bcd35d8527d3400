"""The one schema every caption decomposer produces (paper §3.1).

A caption maps to K pairs (local caption c_k, contextual caption X_k): c_k names one object, attribute or the
background; X_k describes the rest of the scene. `decomposer` records who produced the pairs and with which
settings, e.g. {"name": "oracle"} or {"name": "llm", "model": ..., "prompt_version": ...}.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class LocalContextPair:
    local: str
    context: str


@dataclass
class Decomposition:
    caption: str
    pairs: list[LocalContextPair]
    decomposer: dict[str, Any] = field(default_factory=dict)
    flag: str = ""  # why the result is not the decomposer's own, e.g. "llm failed after 3 retries: ...; rule used"

    def to_dict(self) -> dict[str, Any]:
        d = {"caption": self.caption, "pairs": [{"local": p.local, "context": p.context} for p in self.pairs],
             "decomposer": dict(self.decomposer)}
        if self.flag:
            d["flag"] = self.flag
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Decomposition":
        """Validates as it reads: raises ValueError on a missing field or an empty phrase."""
        if not isinstance(d, dict) or not isinstance(d.get("caption"), str) or not isinstance(d.get("pairs"), list):
            raise ValueError("a decomposition needs a string 'caption' and a list 'pairs'")
        pairs = []
        for k, p in enumerate(d["pairs"]):
            if not isinstance(p, dict) or not isinstance(p.get("local"), str) or not isinstance(p.get("context"), str):
                raise ValueError(f"pair {k} needs string fields 'local' and 'context'")
            if not p["local"].strip():
                raise ValueError(f"pair {k} has an empty local caption")
            pairs.append(LocalContextPair(p["local"], p["context"]))
        return Decomposition(d["caption"], pairs, dict(d.get("decomposer") or {}), str(d.get("flag") or ""))


def caption_hash(caption: str) -> str:
    """The store's key for a caption: sha256 of its UTF-8 text, exactly as given."""
    return hashlib.sha256(caption.encode("utf-8")).hexdigest()


def settings_id(settings: dict[str, Any]) -> str:
    """A short stable id for a decomposer's settings (canonical JSON, sha256, 16 hex digits)."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


class Decomposer(Protocol):
    """What every decomposer offers. `settings` is recorded with each result and keys the store: two runs with the
    same settings share results; a change of model, prompt or K limits makes a new key."""

    settings: dict[str, Any]

    def decompose_batch(self, captions: list[str]) -> list[Decomposition]: ...


@dataclass
class DecomposerOptions:
    """What a decomposer may be built from; each reads the fields it needs."""

    records: list | None = None  # the input records (`decompose.inputs.CaptionRecord`); oracle reads their truth
    llm: Any = None  # an `LLMConfig` (llm)
    max_pairs: int = 5  # most (local, context) pairs per caption
