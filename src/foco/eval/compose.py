"""Composing queries for a benchmark part: every method, every benchmark, one loop.

    composed = compose(method, bench, feats)             # ComposedQuery: query (Q, D), attention (Q, P) or None

Queries are built in batches of `QueryBatch` from the part's cached features (`foco.benchmarks.cache`). With
several text variants per query (FashionIQ's "both" join), each variant is composed with the reference and the query
is normalize(sum of the normalised variant queries).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..backbones.base import ImageFeatures
from ..benchmarks.base import CIRBenchmark
from ..benchmarks.cache import PartFeatures
from ..methods.base import QueryBatch, QueryMethod
from ..model.box import query_box_masks
from ..model.encoder import ComposedQuery
from ..utils.device import move


def reference_rows(bench: CIRBenchmark, feats: PartFeatures) -> torch.Tensor:
    """(Q,) row of each query's reference in `feats.references`."""
    pos = {r: i for i, r in enumerate(feats.reference_ids)}
    return torch.tensor([pos[q.reference] for q in bench.queries], dtype=torch.long)


def box_masks(bench: CIRBenchmark, num_patches: int, min_cover: float = 0.25) -> torch.Tensor | None:
    """(Q, P) bool: each query's patches inside its box (OACIR; `foco.model.box.query_box_masks`); rows of queries
    without a box are all False. None when no query has a box."""
    try:
        return query_box_masks(bench.queries, num_patches, min_cover)
    except ValueError as exc:
        raise ValueError(f"{bench.name} {bench.split}: {exc}") from None


def compose(method: QueryMethod, bench: CIRBenchmark, feats: PartFeatures, batch_size: int = 256,
            anchors: torch.Tensor | None = None, attn_bias: torch.Tensor | None = None) -> ComposedQuery:
    """One composed query per benchmark query.

    Args:
        anchors: (Q, D) a separate F_Aggr anchor per query (T_m decomposed); methods that read anchors only.
        attn_bias: (Q, P) additive F_Aggr attention logits per query (box anchoring); likewise.
    A method that reads boxes (`reads_box`, AdaFocal) gets each batch's `box_mask` from the queries' boxes; every
    other method composes as it would without them (the zero-shot methods "as they are").
    Returns:
        query (Q, D) float32; attention (Q, P) when the method has one and each query has one text variant; both on
        the method's device (`QueryMethod.device`), where every batch is composed.
    """
    if (anchors is not None or attn_bias is not None) and not method.reads_anchor:
        raise ValueError(f"{type(method).__name__} takes no anchor or attention bias")
    n_variants = {len(q.texts) for q in bench.queries}
    if len(n_variants) != 1:
        raise ValueError(f"{bench.name}: queries have different numbers of text variants {sorted(n_variants)}")
    ref_rows = reference_rows(bench, feats)  # (Q,)
    masks = box_masks(bench, feats.references.patches.shape[1]) if method.reads_box else None  # (Q, P) or None
    text_pos = {t: i for i, t in enumerate(feats.text_ids)}
    queries, attention = [], []
    for v in range(n_variants.pop()):
        texts = [q.texts[v] for q in bench.queries]
        text_rows = torch.tensor([text_pos[t] for t in texts], dtype=torch.long)  # (Q,)
        out, att = [], []
        for s in range(0, len(texts), batch_size):
            r, t = ref_rows[s:s + batch_size], text_rows[s:s + batch_size]
            batch = QueryBatch(
                reference=ImageFeatures(feats.references.global_[r], feats.references.patches[r],  # patches read now
                                        None if feats.references.norm is None else feats.references.norm[r]),
                modification=feats.texts.take(t),  # read from the cache now
                texts=texts[s:s + batch_size],
                anchor=None if anchors is None else anchors[s:s + batch_size],
                attn_bias=None if attn_bias is None else attn_bias[s:s + batch_size],
                box_mask=None if masks is None else masks[s:s + batch_size])
            batch = move(batch, method.device)  # pinned, non-blocking on CUDA
            with torch.inference_mode():
                cq = method.encode(batch)
            out.append(cq.query.float().to(method.device))  # (b, D); a text tower may hand its features back on the CPU
            if cq.attention is not None:
                att.append(cq.attention.float().to(method.device))  # (b, P)
        queries.append(torch.cat(out))  # (Q, D)
        attention.append(torch.cat(att) if att else None)
    if len(queries) == 1:
        return ComposedQuery(queries[0], attention[0], None)
    return ComposedQuery(F.normalize(sum(F.normalize(q, dim=-1) for q in queries), dim=-1), None, None)
