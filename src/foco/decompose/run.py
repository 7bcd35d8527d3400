"""The decomposition job: every distinct caption once into the store; resumable at any point.

A decomposer that computes (rule, oracle) is handed `batch_size` captions at a time, one store transaction each. A
decomposer with a `decompose_stream` (llm) keeps its requests in flight across transactions: results are stored
as they complete, every `commit_every` results or `commit_seconds` seconds."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.io import iter_batches
from ..utils.progress import Bar, NoBar
from .schema import Decomposer, Decomposition, caption_hash
from .store import DecompositionStore


@dataclass
class DecomposeStats:
    captions: int = 0          # rows read
    distinct: int = 0          # distinct captions
    already_done: int = 0      # found in the store at start
    done_now: int = 0
    flagged: int = 0           # done now by a fallback
    flagged_in_store: int = 0  # every flagged row of these settings after the run (retry with --retry-flagged)
    retried: int = 0           # flagged rows asked again (--retry-flagged)
    seconds: float = 0.0
    settings_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # the decomposer's own counters (requests, retries, ...)

    @property
    def captions_per_s(self) -> float:
        return self.done_now / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        lines = [f"{self.captions} captions, {self.distinct} distinct: {self.already_done} already in the store, "
                 f"{self.done_now} decomposed now in {self.seconds:.1f}s ({self.captions_per_s:.1f} captions/s)",
                 f"flagged (fallback used): {self.flagged} now, {self.flagged_in_store} in the store"
                 + (f"; {self.retried} flagged captions retried" if self.retried else "")
                 + ("; ask again with --retry-flagged" if self.flagged_in_store and not self.retried else "")]
        if self.extra:
            lines.append("decomposer: " + ", ".join(f"{k}={v}" for k, v in sorted(self.extra.items())))
        return "\n".join(lines)


def shard_of(caption: str, n: int) -> int:
    """The shard (0..n-1) of a caption: a function of its text alone, so that every server computes the same
    split whatever the input order."""
    return int(caption_hash(caption)[:15], 16) % n


def parse_shard(value: str) -> tuple[int, int]:
    """"i/n" -> (i, n) with 0 <= i < n <= 1,000,000, each in ASCII digits (`foco.utils.parse`: never "1_0")."""
    from ..utils.parse import ascii_integer
    try:
        i, n = (ascii_integer(v, 0, 1_000_000) for v in value.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes i/n in ASCII digits with n at most 1,000,000 (e.g. 0/4), got {value!r}"
                         ) from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {value}: need 0 <= i < n")
    return i, n


def run_decompose(captions: list[str], decomposer: Decomposer, store_path: str | Path, batch_size: int = 64,
                  show_progress: bool = True, retry_flagged: bool = False,
                  shard: tuple[int, int] | None = None, source: dict | None = None, commit_every: int = 256,
                  commit_seconds: float = 5.0) -> DecomposeStats:
    """Decomposes every distinct caption (only those of `shard` = (i, n), when given) into the store, and records
    the run (`source`: what the captions were read from) in the store's provenance."""
    distinct = list(dict.fromkeys(captions))
    if shard is not None:
        distinct = [c for c in distinct if shard_of(c, shard[1]) == shard[0]]
    stats = DecomposeStats(captions=len(captions), distinct=len(distinct))
    with DecompositionStore(store_path) as store:
        sid = store.register(decomposer.settings)
        stats.settings_id = sid
        store.record_run(sid, {**(source or {}), "captions": len(captions), "shard": list(shard) if shard else None})
        done = store.done_hashes(sid, include_flagged=not retry_flagged)
        todo = [c for c in distinct if caption_hash(c) not in done]
        if retry_flagged:
            stored = store.done_hashes(sid)
            stats.retried = sum(1 for c in todo if caption_hash(c) in stored)
        stats.already_done = len(distinct) - len(todo)
        t0 = time.perf_counter()
        with Bar(len(distinct), f"decompose ({decomposer.settings.get('name')})", initial=stats.already_done) \
                if show_progress else NoBar() as bar:
            def commit(results: list[Decomposition]) -> None:
                stats.done_now += store.put_many(sid, results, replace_flagged=retry_flagged)
                stats.flagged += sum(1 for d in results if d.flag)
                bar.update(len(results))

            stream = getattr(decomposer, "decompose_stream", None)
            if stream is not None:
                stream(todo, commit, commit_every, commit_seconds)
            else:
                for batch in iter_batches(todo, batch_size):
                    results: list[Decomposition] = decomposer.decompose_batch(batch)
                    if [d.caption for d in results] != batch:
                        raise RuntimeError("decomposer returned results out of order")
                    commit(results)
        stats.seconds = time.perf_counter() - t0
        stats.flagged_in_store = store.flagged(sid)
    stats.extra = dict(getattr(decomposer, "stats", {}) or {})
    return stats

