"""Ablations 1a-1c (issue 40): the focus without F_Aggr (the global feature, class-activation masking) and F_Comp
replaced by linear feature fusion, each against a per-pair loop, and L_aggr left out where nothing can learn it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from foco.model.aggr import CAM_THRESHOLD, FixedFocus
from foco.model.comp import LinearFusion
from foco.model.encoder import ComposedQueryEncoder, FoCoConfig
from foco.train.data import TrainBatch
from foco.train.losses import foco_losses, plan_negatives


def _cam_twin(text, patches):
    """One (image, text) pair at a time: activations, min-max normalised, kept at the threshold, two means."""
    B, T, _ = text.shape
    P = patches.shape[1]
    loc, bg = torch.zeros(B, T, patches.shape[2]), torch.zeros(B, T, patches.shape[2])
    for b in range(B):
        for t in range(T):
            act = [float(F.cosine_similarity(patches[b, p], text[b, t], dim=0)) for p in range(P)]
            lo, hi = min(act), max(act)
            keep = [p for p in range(P) if (act[p] - lo) / max(hi - lo, 1e-6) >= CAM_THRESHOLD or act[p] == hi]
            rest = [p for p in range(P) if p not in keep] or list(range(P))
            loc[b, t] = patches[b, keep].mean(0)
            bg[b, t] = patches[b, rest].mean(0)
    return loc, bg


def test_cam_masking_matches_a_per_pair_loop_and_global_copies_the_image():
    g = torch.Generator().manual_seed(0)
    text, patches = torch.randn(3, 4, 16, generator=g), torch.randn(3, 9, 16, generator=g)
    image_global = F.normalize(torch.randn(3, 16, generator=g), dim=-1)
    loc, bg, w = FixedFocus("cam")(text, image_global, patches)
    want_loc, want_bg = _cam_twin(text, patches)
    assert torch.allclose(loc, want_loc, atol=1e-5) and torch.allclose(bg, want_bg, atol=1e-5)
    assert torch.allclose(w.sum(-1), torch.ones(3, 4)) and (w > 0).sum(-1).min() >= 1
    # a box bias moves the mask onto the boxed patches
    box = torch.full((3, 9), -100.0)
    box[:, 4] = 0.0
    _, _, wb = FixedFocus("cam")(text, image_global, patches, attn_bias=box)
    assert torch.equal(wb.argmax(-1), torch.full((3, 4), 4)) and torch.allclose(wb[..., 4], torch.ones(3, 4))
    # flat activations (every patch alike): every patch is a top one, nothing is divided by zero
    flat = patches[:, :1].expand(3, 9, 16).clone()
    loc, bg, w = FixedFocus("cam")(text, image_global, flat)
    assert torch.isfinite(loc).all() and torch.allclose(w, torch.full((3, 4, 9), 1 / 9))
    assert torch.allclose(loc, flat[:, :1].expand(3, 4, 16), atol=1e-6)
    loc, bg, w = FixedFocus("global")(text, image_global, patches)
    assert torch.equal(loc, image_global[:, None].expand(3, 4, 16)) and torch.allclose(bg, patches.mean(1,
                                                                                                  keepdim=True))
    assert list(FixedFocus("global").parameters()) == []
    with pytest.raises(ValueError, match="focus"):
        FixedFocus("attention")


def test_linear_fusion_starts_as_pic2words_sum_and_matches_a_loop():
    g = torch.Generator().manual_seed(1)
    fusion = LinearFusion(8)
    v, bgr = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    tokens, mask = torch.randn(2, 5, 8, generator=g), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    h = fusion(v, bgr, tokens, mask)
    for t in range(2):
        x = F.normalize(tokens[t, mask[t]].mean(0), dim=0)
        for n in range(3):  # identity maps at the start: the normalised sum of image and text (Pic2Word's baseline)
            assert torch.allclose(h[t, n], F.normalize(F.normalize(v[t, n], dim=0) + x, dim=0), atol=1e-6)
    with torch.no_grad():
        fusion.w_v.weight.mul_(2.0)
    assert not torch.allclose(fusion(v, bgr, tokens, mask), h)
    assert torch.equal(fusion(v, bgr * 0, tokens, mask), fusion(v, bgr, tokens, mask))  # no background


def _batch(b=4, K=2, L=5, P=6, D=16, seed=0, partial=False):
    g = torch.Generator().manual_seed(seed)
    local_mask, ctx_mask = torch.ones(b, K, dtype=torch.bool), torch.ones(b, K, L, dtype=torch.bool)
    if partial:  # images with fewer pairs (padding), and contexts of several lengths
        local_mask[::2, 1] = False
        ctx_mask[:, :, 3:] = torch.rand(b, K, L - 3, generator=g) < 0.5
    return TrainBatch(F.normalize(torch.randn(b, D, generator=g), dim=-1), torch.randn(b, P, D, generator=g),
                      F.normalize(torch.randn(b, K, D, generator=g), dim=-1), local_mask,
                      torch.randn(b, K, L, D, generator=g), ctx_mask)


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("focus,layers", [("global", "linear"), ("attention", "linear"), ("cam", "transformer")])
def test_each_ablation_trains_only_what_it_has(focus, layers, partial):
    model = ComposedQueryEncoder(FoCoConfig(dim=16, heads=4, focus=focus, comp_layers=layers))
    batch = _batch(partial=partial)
    plan = plan_negatives(batch.local_mask, None, torch.Generator().manual_seed(0))
    out = foco_losses(model, batch, plan, with_comp=True)
    assert all(torch.isfinite(v).all() for v in out.values())
    out["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    if focus == "attention":
        assert out["aggr"].item() != 0 and model.log_scale_aggr.grad is not None
        assert all(p.grad is not None for p in model.aggr.parameters())
    else:  # no F_Aggr: no L_aggr, and nothing of F_Aggr's temperature learns
        assert out["aggr"].item() == 0 and model.log_scale_aggr.grad is None
        assert list(model.aggr.parameters()) == []
    assert all(p.grad is not None for p in model.comp.parameters())
    q = model.encode(_features(batch), _text(batch)).query
    assert q.shape == (4, 16) and torch.allclose(q.norm(dim=-1), torch.ones(4), atol=1e-5)


def _features(batch):
    from foco.backbones.base import ImageFeatures
    return ImageFeatures(batch.image_global, batch.patches)


def _text(batch):
    from foco.backbones.base import TextFeatures
    return TextFeatures(batch.local[:, 0], batch.ctx_tokens[:, 0], batch.ctx_mask[:, 0])


def test_training_without_f_aggr_refuses_a_stage_one():
    from foco.train.foco import FoCoTrainConfig, _check_ablations
    with pytest.raises(ValueError, match="--stage1-epochs 0"):
        _check_ablations(FoCoTrainConfig(model=FoCoConfig(focus="cam")))
    _check_ablations(FoCoTrainConfig(stage1_epochs=0, model=FoCoConfig(focus="cam")))
    with pytest.raises(ValueError, match="focus"):
        ComposedQueryEncoder(FoCoConfig(dim=16, heads=4, focus="box"))
