"""The one schema every caption decomposer produces (paper §3.1).

A caption maps to K pairs (local caption c_k, contextual caption X_k): c_k names one object, attribute or the
background; X_k describes the rest of the scene. `decomposer` records who produced the pairs and with which
settings, e.g. {"name": "oracle"} or {"name": "llm", "model": ..., "prompt_version": ...}.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LocalContextPair:
    local: str
    context: str


@dataclass
class Decomposition:
    caption: str
    pairs: list[LocalContextPair]
    decomposer: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"caption": self.caption, "pairs": [{"local": p.local, "context": p.context} for p in self.pairs],
                "decomposer": dict(self.decomposer)}

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
        return Decomposition(d["caption"], pairs, dict(d.get("decomposer") or {}))
