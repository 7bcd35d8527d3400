"""PACT and TSCIR data-parallel (issue 15): every phase's losses and gradients on 2 gloo ranks equal one process's
on the same global batch of 16. The composers' texts come out of the trained tower, so the ranks gather them with
their gradient; PACT's L_preserve splits the global batch's distinct source images (an odd count here) over ranks.

The one-process reference runs the text tower on the ranks' halves of each call: MiniLM's numerics depend on the
batch's padded length, so only the same split can match to 1e-5 (the rest, mapper and losses, sees the whole batch).
Dropout is off in both, because each rank draws its own masks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from test_distributed import _backward_and_report, _finish, _init, _rendezvous

# a global batch of 16 triplets (two per source image) with 9 distinct sources, an odd count; sources 0 and 4 are
# on both ranks' halves, so that the distinct sources must be those of the global batch, not each rank's
IDX = torch.tensor([0, 2, 3, 4, 5, 6, 7, 8, 1, 9, 10, 11, 12, 13, 14, 40])


def _table():
    """64 triplets over 32 spread images (two per source); each has a target caption (whose feature is another
    image, so that TSCIR retrieves it as the target) and two negative captions."""
    from foco.feature_store import TokenView
    from foco.train.edit_data import EditTable
    D, P, n, T = 256, 64, 32, 64
    g = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(n, D, generator=g), dim=-1)
    extra = F.normalize(torch.randn(8, D, generator=g), dim=-1)  # negative captions
    texts = torch.cat([images, extra])
    source = torch.arange(T) // 2
    negatives = torch.stack([n + torch.arange(T) % 8, n + (torch.arange(T) + 3) % 8], 1)
    words = ["left", "right", "up", "down", "red", "blue"]
    return EditTable(images, torch.randn(n, P, D, generator=g), texts,
                     TokenView.padded(torch.zeros(n + 8, 1, D), torch.ones(n + 8, 1, dtype=torch.bool)), source, source, (source + 1) % n, negatives,
                     [f"move it {words[t % 6]} {t}" for t in range(T)], source, torch.full((T,), -1))


def _setup(kind: str):
    from foco import create_backbone
    from foco.train.pact import PACTTrainConfig, build_composer
    from foco.train.tscir import TSCIRTrainConfig
    backbone = create_backbone("world:pretrained")
    cfg = PACTTrainConfig(visual_weight=0.5) if kind.startswith("pact") else TSCIRTrainConfig()
    torch.manual_seed(0)
    table = _table()
    composer = build_composer(kind.split("-")[0], "pic2word" if kind.startswith("pact") else "vsi", cfg.model,
                              cfg.text, backbone, 256, patch_dim=256)
    composer.eval()
    return composer, table, cfg


def _losses(kind: str, composer, table, cfg, env):
    from foco.train.pact import identity_losses, joint_losses
    from foco.train.tscir import MappingData, composing_losses, mapping_losses
    images = F.normalize(table.image_global, dim=-1)
    if kind == "pact-identity":
        return identity_losses(composer, images, IDX % 32, 0.07, env)
    if kind == "pact-joint":
        return joint_losses(composer, table, images, IDX, cfg, 0.07, env)
    if kind == "tscir-mapping":
        data = MappingData(images, table.patches, F.normalize(table.text_global, dim=-1), torch.arange(32),
                           (torch.arange(32) + 1) % 32)
        return mapping_losses(composer, data, IDX % 32, cfg, 0.07, env)
    kept = table.with_targets(0.99)[0]
    return composing_losses(composer, kept, IDX, 0.07, env)


def _grads(composer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in composer.named_parameters() if p.grad is not None}


KINDS = ("pact-identity", "pact-joint", "tscir-mapping", "tscir-composing")


def _worker(rank: int, world: int, rendezvous: str, out: str) -> None:
    """Every kind's losses and gradients on this rank, one process group for all (rank 0 saves them)."""
    _init(rank, world, rendezvous)
    from foco.train.distributed import DistEnv, data_parallel
    env = DistEnv(rank, world)
    for kind in KINDS:
        composer, table, cfg = _setup(kind)
        if kind == "tscir-composing":
            composer.mapper.requires_grad_(False)  # stage 2 trains the tower alone
        objective = data_parallel(composer, env)
        losses = objective(lambda: _losses(kind, composer, table, cfg, env))
        _backward_and_report(losses, composer, env, f"{out}.{kind}")
    _finish(rank, world)


def _halves(text):
    """The text tower run on the two ranks' parts of each call (`torch.tensor_split`, as the ranks split)."""
    forward = text.forward

    def chunked(texts, embeddings, placeholder="*"):
        parts = torch.tensor_split(torch.arange(len(texts)), 2)
        return torch.cat([forward([texts[i] for i in p.tolist()], embeddings[p], placeholder) for p in parts])
    text.forward = chunked


@pytest.mark.slow
def test_composer_phases_on_two_ranks_match_one_process(tmp_path):
    from safetensors.torch import load_file
    from foco.train.distributed import DistEnv
    out = str(tmp_path / "grads")
    mp.start_processes(_worker, args=(2, _rendezvous(tmp_path), out), nprocs=2, start_method="spawn")
    for kind in KINDS:
        composer, table, cfg = _setup(kind)
        if kind == "tscir-composing":
            composer.mapper.requires_grad_(False)
        _halves(composer.text)
        losses = _losses(kind, composer, table, cfg, DistEnv())
        losses["loss"].backward()
        got, got_losses = load_file(f"{out}.{kind}"), json.loads(Path(f"{out}.{kind}.json").read_text())
        assert set(got_losses) == set(losses), kind
        for k, v in losses.items():
            assert abs(got_losses[k] - float(v.detach())) < 1e-5, (kind, k, got_losses[k], float(v))
        want = _grads(composer)
        assert set(got) == set(want) and want, kind
        for name in want:
            assert torch.allclose(got[name], want[name], atol=1e-5, rtol=1e-4), (kind, name,
                                                                                  (got[name] - want[name]).abs().max())


@pytest.mark.slow
def test_tscir_trains_under_torchrun(tiny_world, train_features, tmp_path):  # noqa: F811
    """The command itself: `torchrun --nproc_per_node 2 -m foco tscir train` ends with one checkpoint, written by
    rank 0, that loads. TSCIR wraps the composer in DDP again at its second stage; `foco pact train` goes through
    the same process-group set-up (`cli/composers.py`), and its losses are checked above."""
    import os
    import shutil
    import subprocess
    import sys
    from foco import create_backbone
    from foco.cli import main
    from foco.methods.composer import TextComposer
    store = tmp_path / "e.sqlite"
    assert main(["edits", "generate", "--in", str(tiny_world), "--out", str(store), "--per-caption", "1",
                 "--limit", "200"]) == 0  # 2 steps of 32 read 64 of them
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    common = ["--features", str(train_features), "--edits", str(store), "--edit-features", str(tmp_path / "texts"),
              "--batch-size", "32", "--max-steps", "2"]
    runs = {"tscir": ["--stage1-epochs", "1", "--stage2-epochs", "1", "--target-threshold", "auto"]}
    backbone = create_backbone(json.loads((train_features / "manifest.json").read_text())["backbone"])
    for method, extra in runs.items():
        out = tmp_path / method
        r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "foco", method, "train", *common,
                            "--out", str(out), *extra], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.count(f"{method.upper()} in {out}") == 1  # one rank reports
        log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        assert len(log) == 2 and all(rec["loss"] == rec["loss"] for rec in log)  # two phases, finite
        TextComposer.load(out, backbone, expect=method)
