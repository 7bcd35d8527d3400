"""foco-edits, FoCo's third stage on edit triplets (not in the FoCo paper): the batched losses against a
per-example twin, training after the paper's two stages, resuming into the new stage, and learning the task."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.model.encoder import shape_fields
from foco.train.edit_data import EditBatch
from foco.train.losses import edit_losses



def _random_batch(B=5, D=16, P=4, L=6, Kn=2, seed=0) -> EditBatch:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 4:] = False
    neg_mask = torch.ones(B, Kn, dtype=torch.bool)
    neg_mask[2, 1] = False
    return EditBatch(ImageFeatures(torch.randn(B, D, generator=g), torch.randn(B, P, D, generator=g)),
                     TextFeatures(F.normalize(torch.randn(B, D, generator=g), dim=-1), torch.randn(B, L, D, generator=g),
                                  mask),
                     F.normalize(torch.randn(B, D, generator=g), dim=-1),
                     F.normalize(torch.randn(B, Kn, D, generator=g), dim=-1), neg_mask, [f"edit {i}" for i in range(B)],
                     F.normalize(torch.randn(B, D, generator=g), dim=-1), torch.tensor([True, False, True, True, False]))


@pytest.mark.parametrize("use_negatives,image_weight", [(True, 0.0), (False, 0.0), (True, 0.5)])
def test_edit_losses_match_a_per_example_twin(use_negatives, image_weight):
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=16, heads=4)).eval()
    b, tau, w = _random_batch(), 0.07, 0.3
    got = edit_losses(model, b, tau, w, use_negatives, image_weight)
    B = b.target.shape[0]
    with torch.no_grad():  # one example at a time
        h = [model.encode(ImageFeatures(b.reference.global_[i:i + 1], b.reference.patches[i:i + 1]),
                          TextFeatures(b.instruction.global_[i:i + 1], b.instruction.tokens[i:i + 1],
                                       b.instruction.mask[i:i + 1])).query[0] for i in range(B)]
    v = F.normalize(b.reference.global_, dim=-1)
    compose_rows, compose_cols, preserve = 0.0, 0.0, 0.0
    for i in range(B):
        cands = [float(h[i] @ b.target[j]) / tau for j in range(B)]
        if use_negatives:
            cands += [float(h[i] @ b.negatives[i, k]) / tau for k in range(b.negatives.shape[1]) if b.negative_mask[i, k]]
        compose_rows += -(cands[i] - torch.logsumexp(torch.tensor(cands), 0).item())
        col = [float(b.target[i] @ h[j]) / tau for j in range(B)]
        compose_cols += -(col[i] - torch.logsumexp(torch.tensor(col), 0).item())
        pres = [float(h[i] @ v[j]) / tau for j in range(B)]
        preserve += -(pres[i] - torch.logsumexp(torch.tensor(pres), 0).item())
    compose = 0.5 * (compose_rows + compose_cols) / B
    assert got["compose"].item() == pytest.approx(compose, abs=1e-4)
    assert got["preserve"].item() == pytest.approx(preserve / B, abs=1e-4)
    image = 0.0
    rows = [i for i in range(B) if b.has_target_image[i]]  # only triplets with a target image, among themselves
    for i in rows:
        logits = [float(h[i] @ b.target_image[j]) / tau for j in rows]
        image += -(logits[rows.index(i)] - torch.logsumexp(torch.tensor(logits), 0).item())
    image /= len(rows)
    if image_weight:
        assert got["target_image"].item() == pytest.approx(image, abs=1e-4)
    else:
        assert "target_image" not in got
    assert got["loss"].item() == pytest.approx(compose + w * preserve / B + image_weight * image, abs=1e-4)


def _train(train_features, tiny_world, out, stage3, edits, resume=False):  # noqa: F811
    from foco.train.data import build_pair_table
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.world.decompositions import world_decompositions
    table = build_pair_table(train_features, world_decompositions(tiny_world, "train"))
    cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=64, lr_stage1=1e-3, lr_aggr=5e-4,
                          lr_comp=5e-4, stage3_epochs=stage3, lr_edit_aggr=1e-3, lr_edit_comp=1e-3,
                          model=FoCoConfig(learn_bias=True, **shape_fields("compact")))
    # the shape this test was calibrated on (issue 39 made "paper" the default): what it checks is the edit stage
    return train_foco(table, out, cfg, resume=resume, edits=edits)


def _target_hits(model, table, n=512) -> float:
    idx = torch.arange(n)
    b = table.batch(idx)
    with torch.no_grad():
        h = model.encode(b.reference, b.instruction).query  # (n, D)
    return (torch.argmax(h @ b.target.t(), 1) == idx).float().mean().item()


@pytest.mark.slow
def test_foco_edits_learns_and_resumes_into_the_new_stage(tiny_world, train_features, edit_table, tmp_path):  # noqa: F811
    straight = _train(train_features, tiny_world, tmp_path / "straight", 4, edit_table)
    log = [json.loads(line) for line in (tmp_path / "straight" / "train_log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in log] == [1, 2, 3, 3, 3, 3]
    assert log[-1]["compose"] < log[2]["compose"]
    meta = json.loads((tmp_path / "straight" / "foco.json").read_text())
    assert "not in the FoCo paper" in meta["recipe"] and meta["train"]["stage3_epochs"] == 4
    # the paper's two stages first, then the edit stage by resuming the same folder: the same weights
    paper = _train(train_features, tiny_world, tmp_path / "two", 0, None)
    assert "recipe" not in json.loads((tmp_path / "two" / "foco.json").read_text())
    before = _target_hits(paper, edit_table)
    resumed = _train(train_features, tiny_world, tmp_path / "two", 4, edit_table, resume=True)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    # it learned the task: an instruction on its source image finds its own target caption among 512 far more
    # often than chance (1/512) and than after the paper's stages alone
    after = _target_hits(straight, edit_table)
    assert after > max(2 * before, 4 / 512), (before, after)
    with pytest.raises(ValueError, match="--edits"):
        _train(train_features, tiny_world, tmp_path / "x", 2, None)
