"""Precision / recall of local phrases against the world's oracle, and captions/s, for `rule` and `llm`.

    python experiments/decomposition_quality.py --world runs/quickstart/world --n 500 --decomposers rule
    python experiments/decomposition_quality.py --world runs/quickstart/world --n 500 --decomposers llm \
        --llm-url http://127.0.0.1:8000/v1 --store runs/decompose-bench.sqlite

The first N distinct captions of the world's train split. Each decomposer writes into `--store` (resumable: a
rerun only decomposes what is missing, and its speed is then measured on that remainder). captions/s is wall time
of `run_decompose`, retries and fallbacks included.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

from foco.decompose import DecompositionStore, build_decomposer
from foco.decompose.client import ChatConfig
from foco.decompose.inputs import read_captions
from foco.decompose.llm import LLMConfig
from foco.decompose.quality import local_precision_recall
from foco.decompose.run import run_decompose


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", required=True)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--decomposers", default="rule,llm")
    ap.add_argument("--store", default=None, help="SQLite store (default: a temporary one)")
    ap.add_argument("--llm-url", default=None)
    ap.add_argument("--llm-model", default=None)
    ap.add_argument("--json-mode", action="store_true")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()

    seen, records = set(), []
    for r in read_captions(a.world, split="train"):
        if r.caption not in seen:
            seen.add(r.caption)
            records.append(r)
        if len(records) == a.n:
            break
    store = Path(a.store) if a.store else Path(tempfile.mkdtemp()) / "bench.sqlite"
    results = {"captions": len(records), "machine": f"{platform.machine()}, {platform.processor() or '?'}",
               "decomposers": {}}
    for name in a.decomposers.split(","):
        llm = None
        if name == "llm":
            llm = LLMConfig(ChatConfig(url=a.llm_url or "", model=a.llm_model or "", timeout_s=a.timeout,
                                       max_tokens=300, json_mode=a.json_mode),
                            min_pairs=1, max_pairs=5, concurrency=a.concurrency)
        dec = build_decomposer(name, records, llm)
        try:
            stats = run_decompose([r.caption for r in records], dec, store, batch_size=8)
        finally:
            if hasattr(dec, "close"):
                dec.close()
        with DecompositionStore(store) as s:
            sid = s.resolve(stats.settings_id)
            got = s.get_many(sid, [r.caption for r in records])
            flagged = s.flagged(sid)
        pr = local_precision_recall([got[r.caption] for r in records], [r.truth for r in records])
        results["decomposers"][name] = {
            **{k: round(v, 1) if isinstance(v, float) else v for k, v in pr.items()},
            "captions_per_s": round(stats.captions_per_s, 2), "timed_captions": stats.done_now,
            "flagged": flagged, "stats": stats.extra, "settings": dec.settings}
        print(stats.summary())
    print(f"\n| decomposer | precision | recall | F1 | captions/s | flagged | (on {len(records)} world captions)")
    print("|---|---|---|---|---|---|")
    for name, r in results["decomposers"].items():
        print(f"| {name} | {r['precision']:.1f} | {r['recall']:.1f} | {r['f1']:.1f} | {r['captions_per_s']:.2f} "
              f"| {r['flagged']} |")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
