"""`foco edits generate`: ITT triplets (source image, instruction, target caption, negatives) from decompositions."""
from __future__ import annotations

import argparse
from pathlib import Path

from .rules import declare
from .common import (add_commit_args, add_llm_args, add_owned_output, chat_config, input_record, nonneg_int,
                     positive_int, seed_int)


def _sources(a: argparse.Namespace) -> list:
    """(source id, decomposition) of every input caption: from --decompositions, else the input's own (oracle)."""
    from ..decompose import DecompositionStore
    from ..decompose.inputs import read_captions
    records = read_captions(a.inp, split=a.split, caption_column=a.caption_column)
    if a.limit is not None:
        records = records[:a.limit]
    if a.decompositions is None:
        if any(r.truth is None for r in records):
            raise ValueError(f"{a.inp} carries no decompositions: pass --decompositions STORE (`foco decompose`)")
        return [(r.id, r.truth) for r in records]
    if not Path(a.decompositions).is_file():
        raise FileNotFoundError(f"decomposition store not found: {a.decompositions} (run `foco decompose`)")
    with DecompositionStore(a.decompositions) as store:
        found = store.get_many(store.resolve(a.decomposer), [r.caption for r in records])
    return [(r.id, found[r.caption]) for r in records]


def make_writer(a: argparse.Namespace):
    """The writer of --writer (rule with --templates, or llm with the --llm-* options)."""
    from ..decompose.client import RetryPolicy
    from ..edits import WriterOptions, build_writer
    from ..edits.llm import LLMWriterConfig
    llm = LLMWriterConfig(chat_config(a), RetryPolicy(max_retries=a.retries, backoff_s=a.backoff),
                          concurrency=a.concurrency, write_target=getattr(a, "llm_target", False)) \
        if a.writer == "llm" else None
    return build_writer(a.writer, WriterOptions(a.templates, llm))


def _generate(a: argparse.Namespace) -> int:
    from ..edits.run import GenerateConfig, run_generate
    sources = _sources(a)
    writer = make_writer(a)
    cfg = GenerateConfig(per_caption=a.per_caption, seed=a.seed, min_shared_heads=a.min_shared_heads,
                         batch_size=a.batch_size, commit_every=a.commit_every, commit_seconds=a.commit_seconds)
    try:
        stats = run_generate(sources, writer, a.out, cfg,
                             source={**input_record(a.inp, split=a.split),
                                     "decompositions": input_record(a.decompositions, decomposer=a.decomposer)})
    finally:
        if hasattr(writer, "close"):
            writer.close()
    print(stats.summary())
    if getattr(writer, "stats", None):
        print("writer: " + ", ".join(f"{k}={v}" for k, v in sorted(writer.stats.items())))
    print(f"store: {a.out} (settings id {stats.settings_id})")
    return 0


def _rewrite(a: argparse.Namespace) -> int:
    from ..world.rewrite import rewrite_benchmark
    writer = make_writer(a)
    try:
        counts = rewrite_benchmark(a.root, a.split, a.out, writer, a.seed)
    finally:
        if hasattr(writer, "close"):
            writer.close()
    print(f"rewrote {', '.join(f'{n} {p} queries' for p, n in counts.items())} with the {a.writer} writer"
          + (f" ({a.templates} templates)" if a.writer == "rule" else "") + f" into {a.out}; evaluate with "
          f"foco eval --benchmark world --root {a.out} --split {a.split} --backbone ...")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from ..decompose import DECOMPOSERS
    ed = sub.add_parser("edits", help="edit supervision written from captions").add_subparsers(dest="action",
                                                                                             required=True)
    g = ed.add_parser("generate", help="ITT triplets (instruction, target caption, negatives) from decompositions")
    g.add_argument("--in", dest="inp", required=True,
                   help="the captions with their image ids (CSV / TSV / JSONL, or a world folder: its --split)")
    g.add_argument("--decompositions", default=None,
                   help="SQLite store of `foco decompose` (default: the decompositions the input carries)")
    g.add_argument("--decomposer", default="oracle", help=f"whose decompositions to read: {DECOMPOSERS.names()}")
    g.add_argument("--split", default="train", help="with a world folder: which pairs split (never val or test)")
    g.add_argument("--caption-column", default=None,
                   help="CSV / TSV: the header of the caption column (default: caption, text, alt or title)")
    g.add_argument("--out", required=True, help="SQLite store of triplets (created or resumed)")
    _writer_args(g, templates="train")
    g.add_argument("--per-caption", type=positive_int, default=1, help="edits per source caption")
    g.add_argument("--min-shared-heads", type=nonneg_int, default=2,
                   help="attribute words are of one kind when they modify this many common head nouns")
    g.add_argument("--limit", type=positive_int, default=None, help="only the first N captions")
    g.add_argument("--batch-size", type=positive_int, default=256,
                   help="rule writer: source captions per store transaction (llm: see --commit-every)")
    add_commit_args(g, "source captions")
    g.add_argument("--llm-target", action="store_true", help="llm writer: the model writes the target caption too")
    g.set_defaults(func=_generate)
    declare(g, reads={"inp": "shards or captions", "decompositions": "decomposition store"}, files=("out",),
            values=("split", "caption_column", "llm_url", "llm_model", "llm_key", "decomposer"))

    r = ed.add_parser("rewrite", help="a world benchmark with its instructions rewritten (phrasing robustness)")
    r.add_argument("--root", required=True, help="world folder")
    r.add_argument("--split", default="test", choices=["val", "test"], help="which split to read")
    r.add_argument("--out", required=True, help="a new world folder: rewritten queries, the same galleries")
    add_owned_output(r, kind="world")
    _writer_args(r, templates="heldout")
    r.set_defaults(func=_rewrite)
    declare(r, reads={"root": "world"}, values=("llm_url", "llm_model", "llm_key"))


def _writer_args(p: argparse.ArgumentParser, templates: str) -> None:
    """The options of `make_writer`: the writer, the rule writer's template set, the seed and the LLM server."""
    from ..edits import WRITERS
    p.add_argument("--writer", default="rule", choices=WRITERS.names(),
                   help="who writes the instructions: rule templates or an LLM server")
    p.add_argument("--templates", default=templates, choices=["train", "heldout"],
                   help=f"rule writer: the training templates, or the held-out set training never sees "
                        f"(default {templates})")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_llm_args(p)
