"""`foco decompose`: captions -> (local, context) pairs in a resumable SQLite store (paper §3.1)."""
from __future__ import annotations

import argparse


def _decompose(a: argparse.Namespace) -> int:
    from ..decompose import build_decomposer
    from ..decompose.client import ChatConfig
    from ..decompose.inputs import read_captions
    from ..decompose.llm import LLMConfig
    from ..decompose.run import run_decompose
    records = read_captions(a.inp, split=a.split)
    if a.limit:
        records = records[:a.limit]
    llm = None
    if a.decomposer == "llm":
        llm = LLMConfig(ChatConfig(url=a.llm_url or "", model=a.llm_model or "", api_key=a.llm_key or "",
                                   timeout_s=a.timeout, max_tokens=a.max_tokens, json_mode=a.json_mode),
                        min_pairs=a.min_pairs, max_pairs=a.max_pairs, max_retries=a.retries,
                        concurrency=a.concurrency, backoff_s=a.backoff)
    decomposer = build_decomposer(a.decomposer, records, llm, max_pairs=a.max_pairs)
    try:
        stats = run_decompose([r.caption for r in records], decomposer, a.out, batch_size=a.batch_size)
    finally:
        if hasattr(decomposer, "close"):
            decomposer.close()
    print(stats.summary())
    print(f"store: {a.out} (decomposer settings id {stats.settings_id}); "
          f"train with --decompositions {a.out} --decomposer {a.decomposer}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from ..decompose import DECOMPOSERS
    dc = sub.add_parser("decompose", help="decompose captions into (local, context) pairs into a SQLite store")
    dc.add_argument("--in", dest="inp", required=True,
                    help="CSV / TSV / JSONL of captions (CC3M-style url<TAB>caption works), or a world folder")
    dc.add_argument("--out", required=True, help="SQLite store (created or resumed)")
    dc.add_argument("--decomposer", default="oracle", choices=DECOMPOSERS.names())
    dc.add_argument("--split", default="train", help="with a world folder: which pairs split")
    dc.add_argument("--limit", type=int, default=None, help="only the first N captions")
    dc.add_argument("--batch-size", type=int, default=64, help="captions per store transaction")
    dc.add_argument("--min-pairs", type=int, default=3, help="fewest pairs an LLM answer may give")
    dc.add_argument("--max-pairs", type=int, default=5, help="most pairs (LLM answers; rule keeps the first)")
    llm = dc.add_argument_group("llm (an OpenAI-compatible chat-completions server)")
    llm.add_argument("--llm-url", default=None, help="base URL, e.g. http://127.0.0.1:8000/v1 (env FOCO_LLM_URL)")
    llm.add_argument("--llm-model", default=None, help="model name (env FOCO_LLM_MODEL)")
    llm.add_argument("--llm-key", default=None, help="API key (env FOCO_LLM_API_KEY or OPENAI_API_KEY)")
    llm.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    llm.add_argument("--retries", type=int, default=3, help="retries per caption before the rule fallback")
    llm.add_argument("--backoff", type=float, default=1.0, help="first retry wait in seconds (doubles)")
    llm.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    llm.add_argument("--max-tokens", type=int, default=400)
    llm.add_argument("--json-mode", action="store_true", help="request response_format json_object")
    dc.set_defaults(func=_decompose)
