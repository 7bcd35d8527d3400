"""The `llm` writer: an OpenAI-compatible server writes each derived edit's instruction (and optionally its target
caption), with the decomposer's retry loop (`foco.decompose.client.ask_until_valid`): strict parsing
(`edits.prompt`), backoff, retries, and after the last retry the `rule` writer's instruction, flagged with the
reason; an edit is never dropped. A wrong URL, model or key stops the job. Requests run `concurrency` at a time."""
from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..decompose.client import ChatClient, ChatConfig, RetryPolicy, ask_until_valid
from .prompt import PROMPT_VERSION, build_messages, parse_answer
from .rule import RuleWriter
from .schema import Edit, WriterOptions

Written = tuple[str, str, str]  # (instruction, target caption, flag)


@dataclass
class LLMWriterConfig:
    chat: ChatConfig = field(default_factory=ChatConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    concurrency: int = 4
    write_target: bool = False  # the model writes the target caption too (else the derived one is kept)
    max_words: int = 25


class LLMWriter:
    def __init__(self, cfg: LLMWriterConfig, fallback: RuleWriter | None = None):
        self.cfg = cfg
        self.client = ChatClient(cfg.chat)
        self.fallback = fallback or RuleWriter()
        self.settings: dict[str, Any] = {"name": "llm", "model": self.client.cfg.model, "prompt": PROMPT_VERSION,
                                         "write_target": cfg.write_target, "fallback": self.fallback.settings}
        self.stats: Counter = Counter()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="foco-edit-llm")

    @classmethod
    def from_options(cls, opts: WriterOptions) -> "LLMWriter":
        return cls(opts.llm or LLMWriterConfig(), RuleWriter(opts.templates))

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def _ask(self, job: tuple[str, Edit]) -> tuple[tuple[str, str] | None, str]:
        caption, edit = job
        return ask_until_valid(
            self.client, build_messages(caption, edit, self.cfg.write_target),
            lambda text: parse_answer(text, caption, edit, self.cfg.write_target, self.cfg.max_words),
            self.cfg.retry, self._count, _reason)

    def write_batch(self, items: list[tuple[str, list[Edit], np.random.Generator]]) -> list[list[Written]]:
        jobs = [(caption, e) for caption, edits, _ in items for e in edits]
        answers = iter(self._pool.map(self._ask, jobs))
        out = []
        for caption, edits, rng in items:
            row = []
            for e in edits:
                got, reason = next(answers)
                if got is None:
                    row.append((self.fallback.instruction(e, rng), e.target,
                                f"llm failed after {self.cfg.retry.max_retries + 1} tries ({reason}); rule used"))
                else:
                    self._count("ok")
                    row.append((*got, ""))
            out.append(row)
        return out


def _reason(message: str, invalid: bool) -> str:
    m = message.lower()
    if invalid:
        return "invalid_json" if "json" in m else "ungrounded" if "grounded" in m else "invalid_fields"
    if "timeout" in m:
        return "timeout"
    return "http_" + m.split()[1].rstrip(":") if m.startswith("http ") else "connection"
