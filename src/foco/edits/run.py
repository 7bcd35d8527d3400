"""`foco edits generate`: ITT triplets for every source caption into the store; resumable.

The rule writer is handed `batch_size` sources at a time, one store transaction each. A writer with a
`write_stream` (llm) keeps its requests in flight across transactions, and each source's triplets are stored as
its last edit is written, every `commit_every` sources or `commit_seconds` seconds."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..decompose.schema import Decomposition
from ..utils.io import iter_batches
from ..utils.progress import Bar
from .derive import DERIVATION, PhrasePool, caption_rng, derive_edits
from .schema import ITTRecord
from .store import EditStore


@dataclass
class GenerateConfig:
    per_caption: int = 1  # edits per source caption (distinct targets)
    seed: int = 0
    min_shared_heads: int = 2  # attribute words are of one kind when they modify at least this many common heads
    batch_size: int = 256  # sources per store transaction (a writer that computes: rule)
    commit_every: int = 256  # sources per store transaction (a writer that streams: llm)
    commit_seconds: float = 5.0  # ... or at least this often


@dataclass
class GenerateStats:
    sources: int = 0
    already_done: int = 0
    done_now: int = 0
    triplets_now: int = 0
    flagged: int = 0  # written by a fallback
    seconds: float = 0.0
    settings_id: str = ""
    kinds: dict[str, int] = field(default_factory=dict)  # the whole store's triplets per kind, this setting

    def summary(self) -> str:
        rate = self.triplets_now / self.seconds if self.seconds > 0 else 0.0
        total = sum(self.kinds.values()) or 1
        return (f"{self.sources} source captions: {self.already_done} already in the store, {self.done_now} edited "
                f"now ({self.triplets_now} triplets in {self.seconds:.1f}s, {rate:.1f} triplets/s; "
                f"{self.flagged} flagged)\n"
                "triplets by kind: " + ", ".join(f"{k} {n} ({100 * n / total:.1f}%)" for k, n in self.kinds.items()))


def run_generate(sources: list[tuple[str, Decomposition]], writer, store_path: str | Path, cfg: GenerateConfig,
                 pool: PhrasePool | None = None, source: dict | None = None) -> GenerateStats:
    """`sources`: (source image id, its caption's decomposition). Every id is edited exactly once per setting. The
    run is recorded in the store's provenance (`source`: what the captions and decompositions were read from)."""
    ids = [i for i, _ in sources]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{len(ids) - len(set(ids))} source ids repeat; each image must appear once")
    pool = pool or PhrasePool.build([d for _, d in sources], min_shared_heads=cfg.min_shared_heads)
    settings = {"name": writer.settings["name"], "writer": writer.settings, "per_caption": cfg.per_caption,
                "seed": cfg.seed, "min_shared_heads": cfg.min_shared_heads, "derivation": DERIVATION}
    stats = GenerateStats(sources=len(sources))
    with EditStore(store_path) as store:
        sid = stats.settings_id = store.register(settings)
        store.record_run(sid, {**(source or {}), "sources": len(sources)})
        done = store.done_sources(sid)
        todo = [(i, d) for i, d in sources if i not in done]
        stats.already_done = len(sources) - len(todo)
        t0 = time.perf_counter()
        with Bar(len(sources), f"edits ({writer.settings['name']})", initial=stats.already_done) as bar:
            def commit(written: list[tuple[str, list[ITTRecord]]]) -> None:
                stats.done_now += store.put_many(sid, written)
                stats.triplets_now += sum(len(r) for _, r in written)
                stats.flagged += sum(1 for _, rs in written for r in rs if r.flag)
                bar.update(len(written))

            stream = getattr(writer, "write_stream", None)
            if stream is not None:
                in_flight: dict[str, tuple[Decomposition, list]] = {}  # the sources sent and not yet stored

                def jobs():
                    for source_id, dec, edits, rng in _derived(todo, pool, cfg):
                        in_flight[source_id] = (dec, edits)
                        yield source_id, dec.caption, edits, rng

                stream(jobs(), lambda rows: commit([(i, _records(i, *in_flight.pop(i), w)) for i, w in rows]),
                       cfg.commit_every, cfg.commit_seconds)
            else:
                for batch in iter_batches(todo, cfg.batch_size):
                    commit(_triplets(batch, pool, writer, cfg))
        stats.seconds = time.perf_counter() - t0
        stats.kinds = store.kinds(sid)
    return stats


def _derived(batch, pool: PhrasePool, cfg: GenerateConfig):
    """(source id, decomposition, its edits, its generator) of each source: derived with its own generator, which
    the writer goes on drawing from."""
    for source_id, dec in batch:
        rng = caption_rng(cfg.seed, source_id)
        yield source_id, dec, derive_edits(dec, pool, rng, cfg.per_caption), rng


def _records(source_id: str, dec: Decomposition, edits, written) -> list[ITTRecord]:
    return [ITTRecord(source_id, dec.caption, e.kind, instruction, target, list(e.negatives),
                      {**e.provenance, "phrase": e.phrase, "new": e.new, "old": e.old}, flag)
            for e, (instruction, target, flag) in zip(edits, written)]


def _triplets(batch: list[tuple[str, Decomposition]], pool: PhrasePool, writer, cfg: GenerateConfig
              ) -> list[tuple[str, list[ITTRecord]]]:
    """Each source's edits (derived with its own generator), written by the writer in one batch."""
    items = list(_derived(batch, pool, cfg))
    written = writer.write_batch([(dec.caption, edits, rng) for _, dec, edits, rng in items])
    return [(source_id, _records(source_id, dec, edits, w)) for (source_id, dec, edits, _), w in zip(items, written)]
