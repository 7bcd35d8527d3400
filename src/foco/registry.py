"""One registry pattern for everything that is chosen by name: backbones, methods, benchmarks, decomposers.

    METHODS = Registry("method")
    METHODS.register("sum", "foco.methods.simple:ImageTextSum")     # lazy: imported when first used
    METHODS.get("sum")                                             # -> the class (or factory)

An entry is an object or a lazy "module:attribute" string, so that a registry names heavy implementations
(transformers, spaCy) without importing them. What an entry is (a class, a factory function) is the owner's choice;
the registry only names, lists and resolves, and says what is known when a name is not.
"""
from __future__ import annotations

import importlib
from typing import Any


class Registry:
    """Named entries of one kind, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str, entry: Any) -> None:
        """Adds `name` -> `entry` (an object or "module:attribute"); a name is registered once."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._entries[name] = entry

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> Any:
        """The entry of `name`, imported on first use; ValueError naming the known entries otherwise."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; choose from {', '.join(self._entries)}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attr)
        return entry
