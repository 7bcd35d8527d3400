"""The `llm` decomposer: an LLM behind an OpenAI-compatible server, with retries and a flagged rule fallback.

For each caption: ask (temperature 0), parse strictly (prompt.parse_answer). On a timeout, a 5xx/429 answer or an
invalid answer, wait (exponential backoff) and ask again, up to `max_retries` more times; retries of an invalid
answer sample at `retry_temperature` so that they can differ. After the last retry the caption is decomposed by
`rule` and flagged with the reason: a caption is never dropped. Requests run `concurrency` at a time.
"""
from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .client import ChatClient, ChatConfig, RetryPolicy, ask_until_valid
from .prompt import PROMPT_VERSION, build_messages, parse_answer
from .schema import Decomposer, DecomposerOptions, Decomposition


@dataclass
class LLMConfig:
    chat: ChatConfig = field(default_factory=ChatConfig)
    min_pairs: int = 3
    max_pairs: int = 5
    max_retries: int = 3
    backoff_s: float = 1.0       # first wait; doubles per retry, capped at backoff_max_s, with jitter
    backoff_max_s: float = 30.0
    concurrency: int = 4
    retry_temperature: float = 0.7

    def __post_init__(self) -> None:
        if not 1 <= self.min_pairs <= self.max_pairs:
            raise ValueError(f"need 1 <= min_pairs <= max_pairs, got {self.min_pairs}, {self.max_pairs}")
        if self.concurrency < 1 or self.max_retries < 0:
            raise ValueError("concurrency must be >= 1 and max_retries >= 0")


class LLMDecomposer:
    @classmethod
    def from_options(cls, opts: DecomposerOptions) -> "LLMDecomposer":
        return cls(opts.llm or LLMConfig())

    def __init__(self, cfg: LLMConfig, fallback: Decomposer | None = None):
        self.cfg = cfg
        self.client = ChatClient(cfg.chat)
        if fallback is None:
            from .rule import RuleDecomposer
            fallback = RuleDecomposer(max_pairs=cfg.max_pairs)
        self.fallback = fallback
        self.settings: dict[str, Any] = {
            "name": "llm", "model": self.client.cfg.model, "prompt_version": PROMPT_VERSION,
            "min_pairs": cfg.min_pairs, "max_pairs": cfg.max_pairs, "temperature": self.client.cfg.temperature,
            "json_mode": self.client.cfg.json_mode}
        self._lock = threading.Lock()
        self.stats: Counter = Counter()
        self._last_error: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="foco-llm")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def decompose_batch(self, captions: list[str]) -> list[Decomposition]:
        results: list[Decomposition | None] = list(self._pool.map(self._ask, captions))
        failed = [i for i, r in enumerate(results) if r is None]
        if failed:
            backup = self.fallback.decompose_batch([captions[i] for i in failed])
            for i, d in zip(failed, backup):
                reason = self._last_error.get(captions[i], "unknown")
                results[i] = Decomposition(captions[i], d.pairs, dict(self.settings),
                                           flag=f"llm failed after {self.cfg.max_retries + 1} tries "
                                                f"({reason}); {d.decomposer.get('name', 'fallback')} used")
        return results  # type: ignore[return-value]

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def _ask(self, caption: str) -> Decomposition | None:
        messages = build_messages(caption, self.cfg.min_pairs, self.cfg.max_pairs)
        policy = RetryPolicy(self.cfg.max_retries, self.cfg.backoff_s, self.cfg.backoff_max_s,
                             self.cfg.retry_temperature)
        pairs, reason = ask_until_valid(
            self.client, messages, lambda text: parse_answer(text, caption, self.cfg.min_pairs, self.cfg.max_pairs),
            policy, self._count, _reason)
        if pairs is None:
            with self._lock:
                self._last_error[caption] = reason
            return None
        self._count("ok")
        return Decomposition(caption, pairs, dict(self.settings))


def _reason(message: str, invalid: bool = False) -> str:
    """A short failure category for the statistics."""
    m = message.lower()
    if invalid:
        if "json" in m:
            return "invalid_json"
        if "pairs, expected" in m:
            return "pair_count"
        if "grounded" in m:
            return "ungrounded"
        return "invalid_fields"
    if "timeout" in m:
        return "timeout"
    if m.startswith("http "):
        return "http_" + m.split()[1].rstrip(":")
    return "connection"
