"""FoCo with and without box anchoring on a benchmark whose queries carry a box and a confuser (the world's
ambiguous-reference variant, `foco.world.ambiguous`, is one: its `AmbiguousAnnotations` are `BoxAnnotations`).

    bench, feats = world parts of "val-ambiguous" (`foco.benchmarks.world`)
    val = evaluate_box_anchoring(method, bench, feats, load_ambiguous(world, "val"), grid=8, betas=(-4, -2, 0, 2, 4))
    beta = choose_beta(val)                                    # foco.eval.select

The box is an option of the one evaluation path: `compose(..., attn_bias=beta * box mask)`, then the usual rank
and score. For each beta: the part's metrics, `instance_acc` (percentage of queries whose target outscores the
confuser, the same edit on the other object of the same kind: 50 is a coin flip) and `attn_in_box` (mean F_Aggr
attention mass inside the box, in percent).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..benchmarks.base import CIRBenchmark
from ..benchmarks.cache import PartFeatures
from ..methods.base import QueryMethod
from ..model.box import attention_mass, box_patch_mask
from .compose import compose
from .rank import rank, score



class BoxAnnotations(Protocol):
    """Per query of a benchmark part: a box on the reference and the id of its confuser."""

    boxes: torch.Tensor  # (Q, 4) x0, y0, x1, y1 in pixels of the reference
    image_size: int  # the references' side in pixels
    confusers: Sequence[str]  # (Q,) gallery id of each query's confuser (the edit applied to the other object)


def instance_accuracy(queries: torch.Tensor, bench: CIRBenchmark, feats: PartFeatures,
                      confusers: Sequence[str]) -> float:
    """100 * mean over queries of [cos(query, target) > cos(query, confuser)]."""
    pos = {g: i for i, g in enumerate(feats.gallery_ids)}
    target = feats.gallery[torch.tensor([pos[q.targets[0]] for q in bench.queries])]  # (Q, D)
    confuser = feats.gallery[torch.tensor([pos[c] for c in confusers])]  # (Q, D)
    wins = ((queries * target).sum(-1) > (queries * confuser).sum(-1)).float()  # (Q,)
    return 100.0 * wins.mean().item()


def evaluate_box_anchoring(method: QueryMethod, bench: CIRBenchmark, feats: PartFeatures,
                           ann: BoxAnnotations, grid: int,
                           betas: Sequence[float] = (-4.0, -2.0, 0.0, 2.0, 4.0), min_cover: float = 0.25
                           ) -> dict[float, dict[str, float]]:
    """{beta: metrics} of a method that reads the attention bias (FoCo) on the ambiguous benchmark; beta = 0 is
    the method without the box. The box marks the object to change, so negative betas are the matching sign for
    FoCo (see `foco.model.box`).

    Args:
        grid: the backbone's patch grid side (world: image_size // 8; `foco.model.box.patch_grid(num_patches)`).
    """
    if len(ann.confusers) != len(bench.queries):
        raise ValueError(f"{len(ann.confusers)} annotations for {len(bench.queries)} queries")
    mask = box_patch_mask(ann.boxes, ann.image_size, grid, min_cover)  # (Q, P)
    out = {}
    for beta in betas:
        cq = compose(method, bench, feats, attn_bias=float(beta) * mask.float())  # (Q, D), (Q, P)
        out[float(beta)] = {**score(bench, rank(bench, feats.gallery_ids, feats.gallery, cq.query)),
                            "instance_acc": instance_accuracy(cq.query.cpu(), bench, feats, ann.confusers),
                            "attn_in_box": 100.0 * attention_mass(cq.attention.cpu(), mask).mean().item()}
    return out
