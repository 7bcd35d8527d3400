"""FoCo with and without box anchoring on the ambiguous world benchmark (`foco.world.ambiguous`).

    model = ComposedQueryEncoder.load(ckpt)
    val = evaluate_box_anchoring(model, load_benchmark_features(world, "val-ambiguous", "single", val_cache),
                                 load_ambiguous(world, "val"), grid=8, betas=(-4, -2, 0, 2, 4))
    beta = choose_beta(val)
    test = evaluate_box_anchoring(model, load_benchmark_features(world, "test-ambiguous", "single", test_cache),
                                  load_ambiguous(world, "test"), grid=8, betas=(0.0, beta))

For each beta: the usual `single` metrics (`foco.evaluate.score_queries`), `instance_acc` (percentage of queries
whose target outscores the confuser, the same edit on the other object of the same kind: 50 is a coin flip) and
`attn_in_box` (mean F_Aggr attention mass inside the box, in percent).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .backbones.base import ImageFeatures, TextFeatures
from .box import attention_mass, box_patch_mask
from .evaluate import BenchmarkFeatures, score_queries
from .model.encoder import ComposedQueryEncoder
from .world.ambiguous import AmbiguousAnnotations


@torch.inference_mode()
def compose_box_queries(model: ComposedQueryEncoder, bf: BenchmarkFeatures, box_mask: torch.Tensor, beta: float,
                        batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, D) queries and (Q, P) F_Aggr attention with `beta` added to the logits of the patches in `box_mask`
    (Q, P) bool."""
    queries, attention = [], []
    for s in range(0, len(bf.ref_index), batch_size):
        r = bf.ref_index[s:s + batch_size]
        ref = ImageFeatures(bf.gallery.global_[r], bf.gallery.patches[r])
        mod = TextFeatures(bf.texts.global_[s:s + batch_size], bf.texts.tokens[s:s + batch_size],
                           bf.texts.mask[s:s + batch_size])
        cq = model.encode(ref, mod, attn_bias=beta * box_mask[s:s + batch_size].float())  # bias (b, P)
        queries.append(cq.query.float())
        attention.append(cq.attention.float())
    return torch.cat(queries), torch.cat(attention)


def instance_accuracy(queries: torch.Tensor, bf: BenchmarkFeatures, confusers: Sequence[str]) -> float:
    """100 * mean over queries of [cos(query, target) > cos(query, confuser)]."""
    pos = {g: i for i, g in enumerate(bf.bench.gallery_ids)}
    target = bf.gallery.global_[torch.tensor([t[0] for t in bf.target_index])]  # (Q, D)
    confuser = bf.gallery.global_[torch.tensor([pos[c] for c in confusers])]  # (Q, D)
    wins = ((queries * target).sum(-1) > (queries * confuser).sum(-1)).float()  # (Q,)
    return 100.0 * wins.mean().item()


def evaluate_box_anchoring(model: ComposedQueryEncoder, bf: BenchmarkFeatures, ann: AmbiguousAnnotations,
                           grid: int, betas: Sequence[float] = (-4.0, -2.0, 0.0, 2.0, 4.0), min_cover: float = 0.25
                           ) -> dict[float, dict[str, float]]:
    """{beta: metrics} of FoCo on the ambiguous benchmark; beta = 0 is FoCo without the box. The box marks the
    object to change, so negative betas are the matching sign for FoCo (see `foco.box`).

    Args:
        grid: the backbone's patch grid side (world: image_size // 8; `foco.box.patch_grid(num_patches)`).
    """
    if len(ann.confusers) != len(bf.ref_index):
        raise ValueError(f"{len(ann.confusers)} annotations for {len(bf.ref_index)} queries")
    mask = box_patch_mask(ann.boxes, ann.image_size, grid, min_cover)  # (Q, P)
    out = {}
    for beta in betas:
        queries, attention = compose_box_queries(model, bf, mask, float(beta))
        out[float(beta)] = {**score_queries(queries, bf), "instance_acc": instance_accuracy(queries, bf, ann.confusers),
                            "attn_in_box": 100.0 * attention_mass(attention, mask).mean().item()}
    return out


def choose_beta(results: dict[float, dict[str, float]], metric: str = "R@1") -> float:
    """The beta of `evaluate_box_anchoring`'s val results with the best `metric`; ties go to the smallest |beta|."""
    return max(results, key=lambda b: (results[b][metric], -abs(b)))
