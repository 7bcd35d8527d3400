"""Decomposing the modification text T_m at inference (the paper's optional variant, §3.4 and its Appendix C).

The default inference uses T_m as both the anchor c (F_Aggr) and the context X (F_Comp). With a decomposer, the
anchor becomes T_m's first local phrase ("the yellow square" in "change the yellow square into a cross"), the kind
of text F_Aggr was trained on, and X stays T_m. Anchors are cached per text, so each distinct T_m is decomposed once.
"""
from __future__ import annotations

from .schema import Decomposer


def modification_anchors(texts: list[str], decomposer: Decomposer) -> list[str]:
    """One anchor per text: its first local phrase that leaves a non-empty context, else the text itself."""
    distinct = list(dict.fromkeys(texts))
    anchor = {}
    for d in decomposer.decompose_batch(distinct):
        phrases = [p.local for p in d.pairs if p.context.strip() and not d.flag]
        anchor[d.caption] = phrases[0] if phrases else d.caption
    return [anchor[t] for t in texts]
