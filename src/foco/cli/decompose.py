"""`foco decompose`: captions -> (local, context) pairs in a resumable SQLite store (paper §3.1)."""
from __future__ import annotations

import argparse

from .rules import declare
from .common import add_commit_args, add_llm_args, chat_config, input_record, positive_int


def _decompose(a: argparse.Namespace) -> int:
    from ..decompose import build_decomposer
    from ..decompose.inputs import read_captions
    from ..decompose.llm import LLMConfig
    from ..decompose.run import parse_shard, run_decompose
    if a.inp is None or a.out is None:
        raise ValueError("foco decompose needs --in and --out (or: foco decompose merge --out STORE SHARD...)")
    shard = parse_shard(a.shard) if a.shard else None
    records = read_captions(a.inp, split=a.split, caption_column=a.caption_column)
    if a.limit is not None:
        records = records[:a.limit]
    if a.decomposer is None:  # the ground truth where the input carries it (a world folder), else spaCy's rules
        a.decomposer = "oracle" if records and all(r.truth is not None for r in records) else "rule"
        print(f"decomposer: {a.decomposer} (choose one with --decomposer)")
    llm = None
    if a.decomposer == "llm":
        llm = LLMConfig(chat_config(a), min_pairs=a.min_pairs, max_pairs=a.max_pairs, max_retries=a.retries,
                        concurrency=a.concurrency, backoff_s=a.backoff)
    decomposer = build_decomposer(a.decomposer, records, llm, max_pairs=a.max_pairs)
    try:
        stats = run_decompose([r.caption for r in records], decomposer, a.out, batch_size=a.batch_size,
                              retry_flagged=a.retry_flagged, shard=shard,
                              source=input_record(a.inp, split=a.split, limit=a.limit),
                              commit_every=a.commit_every, commit_seconds=a.commit_seconds)
    finally:
        if hasattr(decomposer, "close"):
            decomposer.close()
    print(stats.summary())
    print(f"store: {a.out} (decomposer settings id {stats.settings_id}); "
          + (f"shard {a.shard}: merge the shards with `foco decompose merge --out STORE SHARD...`" if shard else
             f"train with --decompositions {a.out} --decomposer {a.decomposer}"))
    return 0


def _merge(a: argparse.Namespace) -> int:
    from ..decompose.store import merge_stores
    m = merge_stores(a.stores, a.merge_out)
    print(f"{a.merge_out}: {m.added} rows added, {m.identical} already there from {m.stores} stores; "
          f"{m.settings} decomposer settings, {m.flagged} flagged rows")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from ..decompose import DECOMPOSERS
    dc = sub.add_parser("decompose", help="decompose captions into (local, context) pairs into a SQLite store")
    dc.add_argument("--in", dest="inp", default=None,
                    help="CSV / TSV / JSONL of captions (CC3M-style url<TAB>caption works), or a world folder")
    dc.add_argument("--out", default=None, help="SQLite store (created or resumed)")
    dc.add_argument("--shard", default=None,
                    help="i/n: only the captions of shard i of n (split by caption hash), e.g. one per LLM server")
    dc.add_argument("--decomposer", default=None, choices=DECOMPOSERS.names(),
                    help="default: oracle for a world folder (its ground truth), rule (spaCy) for any other input")
    dc.add_argument("--split", default="train", help="with a world folder: which pairs split")
    dc.add_argument("--caption-column", default=None,
                    help="CSV / TSV: the header of the caption column (default: caption, text, alt or title)")
    dc.add_argument("--retry-flagged", action="store_true",
                    help="ask the decomposer again for the captions a fallback wrote (flagged in the store)")
    dc.add_argument("--limit", type=positive_int, default=None, help="only the first N captions")
    dc.add_argument("--batch-size", type=positive_int, default=64,
                    help="rule, oracle: captions per batch and store transaction (llm: see --commit-every)")
    add_commit_args(dc, "captions")
    dc.add_argument("--min-pairs", type=positive_int, default=3, help="fewest pairs an LLM answer may give")
    dc.add_argument("--max-pairs", type=positive_int, default=5, help="most pairs (LLM answers; rule keeps the first)")
    add_llm_args(dc)
    dc.set_defaults(func=_decompose)
    declare(dc, reads={"inp": "shards or captions"}, files=("out",),
            values=("shard", "split", "caption_column", "llm_url", "llm_model", "llm_key"))
    sub_dc = dc.add_subparsers(dest="decompose_action", required=False)
    mg = sub_dc.add_parser("merge", help="merge decomposition stores (e.g. the shards of --shard i/n)")
    mg.add_argument("--out", dest="merge_out", required=True, help="the merged store (created or extended)")
    mg.add_argument("stores", nargs="+", help="stores to merge into --out")
    mg.set_defaults(func=_merge)
    declare(mg, reads={"stores": "stores"}, files=("merge_out",))
