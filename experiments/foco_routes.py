"""Where FoCo's shortcut lives (issue 39): a trained FoCo queried with each of its two routes alone.

* full: FoCo as trained (`foco eval`'s foco);
* image route alone: F_Aggr reads the reference with the query's own text, but F_Comp's text input (its context
  tokens) is another query's, drawn by a seeded permutation of the split's queries;
* text route alone: F_Comp's visual inputs (v_loc, the background, and so the query's initialisation from v_loc)
  are zeroed; F_Comp reads the query's own text alone.

For each: R@1 and R@5 through the one ranking path (`foco.eval.rank.score_queries`), and text reliance (median
cosine between the query built with its own text and the query built with another query's text, as
experiments/foco_text_reliance.py; 1.0 = the text is ignored).

    python experiments/foco_routes.py --world runs/quickstart/world --features runs/quickstart/features \
        --checkpoints runs/quickstart/foco --protocols single,described --out runs/routes/vit.json
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from foco.benchmarks.world import load_world_part
from foco.eval.compose import compose
from foco.eval.rank import score_queries
from foco.methods.base import QueryBatch, QueryMethod
from foco.methods.foco import FoCoMethod
from foco.model.encoder import ComposedQuery
from foco.utils.io import atomic_write_text

ROUTES = ("full", "image route alone", "text route alone")


class RouteFoCo(QueryMethod):
    """A FoCo encoder with one route cut (module docstring). Composes a whole split as one batch, so that the image
    route's other texts are drawn from every query of the split."""

    def __init__(self, method: FoCoMethod, route: str, seed: int = 0):
        self.model, self.route, self.seed = method.model, route, seed

    @torch.inference_mode()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        m, ref, mod = self.model, batch.reference, batch.modification
        if self.route == "full":
            return m.encode(ref, mod)
        v_loc, background, attn = m.aggr(mod.global_[:, None, :], ref.global_, ref.patches)  # (B, 1, D) x2, (B, 1, P)
        tokens, mask = mod.tokens, mod.mask  # (B, L, D), (B, L)
        if self.route == "image route alone":
            perm = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(self.seed))
            tokens, mask = tokens[perm], mask[perm]
        else:  # text route alone
            v_loc, background = torch.zeros_like(v_loc), torch.zeros_like(background)
        h = m.comp(v_loc, background, tokens, mask)  # (B, 1, D)
        return ComposedQuery(h[:, 0], attn[:, 0], v_loc[:, 0])


def _shuffled_texts(bench, seed: int):
    perm = torch.randperm(len(bench.queries), generator=torch.Generator().manual_seed(seed + 1)).tolist()
    return replace(bench, queries=[replace(q, texts=bench.queries[j].texts) for q, j in zip(bench.queries, perm)])


def route_table(checkpoint: Path, bench, feats, seed: int = 0) -> dict[str, dict[str, float]]:
    foco = FoCoMethod(checkpoint)
    rows = {}
    whole = max(1, len(bench.queries))
    for route in ROUTES:
        method = RouteFoCo(foco, route, seed)
        q = compose(method, bench, feats, batch_size=whole).query  # (Q, D)
        q2 = compose(method, _shuffled_texts(bench, seed), feats, batch_size=whole).query  # (Q, D), other texts
        scores = score_queries(q, bench, feats.gallery_ids, feats.gallery)
        rows[route] = {"R@1": scores["R@1"], "R@5": scores["R@5"],
                       "text reliance": round(float((q * q2).sum(-1).median()), 3)}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", required=True)
    ap.add_argument("--features", required=True, help="the feature folder (SPLIT-PROTOCOL caches)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--protocols", default="single,described")
    ap.add_argument("--checkpoints", nargs="+", required=True, help="FoCo checkpoint folders (one per seed)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the other texts")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = {}
    for protocol in a.protocols.split(","):
        bench, feats = load_world_part(a.world, a.split, protocol, Path(a.features) / f"{a.split}-{protocol}")
        out[protocol] = {str(c): route_table(Path(c), bench, feats, a.seed) for c in a.checkpoints}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(a.out), json.dumps(out, indent=1) + "\n")
    print("| protocol | route | R@1 | R@5 | text reliance |")
    print("|---|---|---|---|---|")
    for protocol, per_ckpt in out.items():
        for route in ROUTES:
            vals = {k: [r[route][k] for r in per_ckpt.values()] for k in ("R@1", "R@5", "text reliance")}
            cells = []
            for k, v in vals.items():
                mean = sum(v) / len(v)
                sd = (sum((x - mean) ** 2 for x in v) / (len(v) - 1)) ** 0.5 if len(v) > 1 else 0.0
                cells.append(f"{mean:.3f} ± {sd:.3f}" if k == "text reliance" else f"{mean:.1f} ± {sd:.1f}")
            print(f"| {protocol} | {route} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
