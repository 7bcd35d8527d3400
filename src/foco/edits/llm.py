"""The `llm` writer: an OpenAI-compatible server writes each derived edit's instruction (and optionally its target
caption), on the engine of every LLM job (`foco.decompose.pipeline`): strict parsing (`edits.prompt`), backoff,
retries, and after the last retry the `rule` writer's instruction, flagged with the reason; an edit is never
dropped. A wrong URL, model or key stops the job. `concurrency` requests stay in flight across store transactions."""
from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

import numpy as np

from ..decompose.client import ChatClient, ChatConfig, RetryPolicy
from ..decompose.pipeline import Ask, PipelineConfig, run_pipeline
from .prompt import PROMPT_VERSION, build_messages, parse_answer
from .rule import RuleWriter
from .schema import Edit, WriterOptions

Written = tuple[str, str, str]  # (instruction, target caption, flag)
Job = tuple[Hashable, str, list[Edit], np.random.Generator]  # (key, source caption, its edits, its generator)


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
        self.client = ChatClient(cfg.chat, connections=cfg.concurrency)
        self.fallback = fallback or RuleWriter()
        self.settings: dict[str, Any] = {"name": "llm", "model": self.client.cfg.model, "prompt": PROMPT_VERSION,
                                         "write_target": cfg.write_target, "fallback": self.fallback.settings}
        self.stats: Counter = Counter()
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, opts: WriterOptions) -> "LLMWriter":
        return cls(opts.llm or LLMWriterConfig(), RuleWriter(opts.templates))

    def close(self) -> None:
        self.client.close()

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def write_stream(self, jobs: Iterable[Job], commit: Callable[[list[tuple[Hashable, list[Written]]]], None],
                     commit_every: int = 256, commit_seconds: float = 5.0) -> None:
        """Writes every job's edits, `concurrency` requests in flight across jobs, and hands (key, one Written
        per edit) to `commit` in groups (completion order) of `commit_every` jobs, or at least every
        `commit_seconds`. A failed edit gets the rule writer's instruction, drawn from the job's generator in
        the order of its edits."""
        cfg = self.cfg

        def asks(job: Job) -> list[Ask]:
            _, caption, edits, _ = job
            return [Ask(build_messages(caption, e, cfg.write_target),
                        lambda text, e=e: parse_answer(text, caption, e, cfg.write_target, cfg.max_words))
                    for e in edits]

        def finish(group: list[tuple[Job, list[tuple[Any, str]]]]) -> None:
            out = []
            for (key, _, edits, rng), answers in group:
                row: list[Written] = []
                for e, (got, reason) in zip(edits, answers):
                    if got is None:
                        row.append((self.fallback.instruction(e, rng), e.target,
                                    f"llm failed after {cfg.retry.max_retries + 1} tries ({reason}); rule used"))
                    else:
                        self._count("ok")
                        row.append((*got, ""))
                out.append((key, row))
            commit(out)

        run_pipeline(jobs, asks, self.client, PipelineConfig(cfg.concurrency, commit_every, commit_seconds,
                                                             cfg.retry), finish, self._count, _reason)

    def write_batch(self, items: list[tuple[str, list[Edit], np.random.Generator]]) -> list[list[Written]]:
        """The results of `write_stream`, in the order of `items`."""
        got: dict[Hashable, list[Written]] = {}
        self.write_stream([(i, c, edits, rng) for i, (c, edits, rng) in enumerate(items)],
                          lambda rows: got.update(rows), commit_every=max(1, len(items)), commit_seconds=math.inf)
        return [got[i] for i in range(len(items))]


def _reason(message: str, invalid: bool) -> str:
    m = message.lower()
    if invalid:
        return "invalid_json" if "json" in m else "ungrounded" if "grounded" in m else "invalid_fields"
    if "timeout" in m:
        return "timeout"
    return "http_" + m.split()[1].rstrip(":") if m.startswith("http ") else "connection"
