"""The `llm` decomposer: an LLM behind an OpenAI-compatible server, with retries and a flagged rule fallback.

For each caption: ask (temperature 0), parse strictly (prompt.parse_answer). On a timeout, a 5xx/429 answer or an
invalid answer, wait (exponential backoff) and ask again, up to `max_retries` more times; retries of an invalid
answer sample at `retry_temperature` so that they can differ. After the last retry the caption is decomposed by
`rule` and flagged with the reason: a caption is never dropped. `concurrency` requests stay in flight across the
store's transactions (`decompose.pipeline`, the engine of every LLM job).
"""
from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .client import ChatClient, ChatConfig, RetryPolicy
from .pipeline import Ask, PipelineConfig, run_pipeline
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
        self.client = ChatClient(cfg.chat, connections=cfg.concurrency)
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

    def close(self) -> None:
        self.client.close()

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def pipeline_config(self, commit_every: int = 256, commit_seconds: float = 5.0) -> PipelineConfig:
        return PipelineConfig(self.cfg.concurrency, commit_every, commit_seconds,
                              RetryPolicy(self.cfg.max_retries, self.cfg.backoff_s, self.cfg.backoff_max_s,
                                          self.cfg.retry_temperature))

    def decompose_stream(self, captions: Iterable[str], commit: Callable[[list[Decomposition]], None],
                         commit_every: int = 256, commit_seconds: float = 5.0) -> None:
        """Decomposes every caption, `concurrency` requests in flight, and hands the results to `commit` in
        groups (completion order) of `commit_every`, or at least every `commit_seconds`."""
        cfg = self.cfg

        def asks(caption: str) -> list[Ask]:
            return [Ask(build_messages(caption, cfg.min_pairs, cfg.max_pairs),
                        lambda text: parse_answer(text, caption, cfg.min_pairs, cfg.max_pairs))]

        def finish(group: list[tuple[str, list[tuple[Any, str]]]]) -> None:
            out, failed = [], []
            for caption, [(pairs, reason)] in group:
                if pairs is None:
                    failed.append((caption, reason))
                else:
                    self._count("ok")
                    out.append(Decomposition(caption, pairs, dict(self.settings)))
            if failed:
                backup = self.fallback.decompose_batch([c for c, _ in failed])
                for (caption, reason), d in zip(failed, backup):
                    out.append(Decomposition(caption, d.pairs, dict(self.settings),
                                             flag=f"llm failed after {cfg.max_retries + 1} tries "
                                                  f"({reason}); {d.decomposer.get('name', 'fallback')} used"))
            commit(out)

        run_pipeline(captions, asks, self.client, self.pipeline_config(commit_every, commit_seconds), finish,
                     self._count, _reason)

    def decompose_batch(self, captions: list[str]) -> list[Decomposition]:
        """The results of `decompose_stream`, in the order of `captions`."""
        got: dict[str, Decomposition] = {}
        self.decompose_stream(list(dict.fromkeys(captions)), lambda rs: got.update((d.caption, d) for d in rs),
                              commit_every=max(1, len(captions)), commit_seconds=math.inf)
        return [got[c] for c in captions]


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
