"""Continue a world backbone's contrastive pretraining with another batch size: does CLIP's large batch teach marks?

Issue 56's backbones stay at chance on the instance check. A caption naming a mark meets only a few in-batch
negatives that the mark alone tells apart (2.59 at batch 256, counted on the data): CLIP's batch was 32,768. This
script starts from a trained backbone's weights (its text cache included) and runs `foco backbone train`'s step
(`foco.train.world_backbone`: the same loss, towers, parameter groups, optimiser and bf16 autocast) for
`--epochs` more epochs at `--batch-size`, with its own warm-up and cosine schedule, then saves a backbone folder
loadable as `world:<out>` whose config records where it started.

    python experiments/backbone_continue.py --world runs/w100k/world --init runs/w100k/backbone \
        --out runs/w100k/backbone-b2048 --batch-size 2048 --epochs 2 --lr 1e-3
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from foco.backbones.world import FrozenMiniLM, WorldBackbone, WorldBackboneConfig, WorldCLIP, save_world_checkpoint
from foco.train.loop import lr_factor
from foco.train.world_backbone import (_clip_step, _param_groups, _world_record, encode_minilm, evaluate_backbone,
                                       load_split_arrays)
from safetensors.torch import load_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, required=True)
    ap.add_argument("--init", type=Path, required=True, help="a world backbone folder to start from")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--warmup-frac", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    init = json.loads((a.init / "config.json").read_text())
    model = WorldCLIP(WorldBackboneConfig(**{k: tuple(v) if isinstance(v, list) else v
                                             for k, v in init["config"].items()}))
    model.load_state_dict(load_file(str(a.init / "model.safetensors")))
    minilm = FrozenMiniLM(model.cfg.text_encoder, model.cfg.max_text_len)
    _, images, captions = load_split_arrays(a.world, "pretrain", model.cfg.image_size)
    states, mask = encode_minilm(minilm, captions, a.init / "cache" / "pretrain_minilm.safetensors")
    step_fn = _clip_step(model, images, states, mask)
    opt = torch.optim.AdamW(_param_groups(model, a.weight_decay), lr=a.lr, betas=(0.9, 0.98))
    n = images.shape[0]
    per_epoch = n // a.batch_size  # the last partial batch is dropped
    total = per_epoch * a.epochs
    g = torch.Generator().manual_seed(a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    log = (a.out / "train_log.jsonl").open("w")
    step = 0
    for epoch in range(1, a.epochs + 1):
        order, losses = torch.randperm(n, generator=g), []
        for b in range(per_epoch):
            lr = a.lr * lr_factor(step, total, a.warmup_frac)  # the loop's warm-up and cosine
            for group in opt.param_groups:
                group["lr"] = lr
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = step_fn(order[b * a.batch_size:(b + 1) * a.batch_size])["loss"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
            if step % 10 == 0:
                print(f"epoch {epoch} step {step}/{total} loss {sum(losses[-10:]) / len(losses[-10:]):.4f} "
                      f"lr {lr:.2e} {time.time() - t0:.0f} s", flush=True)
        log.write(json.dumps({"epoch": epoch, "loss": sum(losses) / len(losses), "elapsed_s": round(time.time() - t0, 1)})
                  + "\n")
        log.flush()
    train_s = round(time.time() - t0, 1)
    metrics = {**evaluate_backbone(WorldBackbone(model, str(a.out), "cpu"), a.world), "train_seconds": train_s}
    save_world_checkpoint(model, a.out, extra={
        "continued_from": {"backbone": str(a.init), "weights_sha256": init["weights_sha256"]},
        "continuation": {"batch_size": a.batch_size, "epochs": a.epochs, "lr": a.lr, "weight_decay": a.weight_decay,
                         "warmup_frac": a.warmup_frac, "seed": a.seed, "precision": "bf16",
                         "script": "experiments/backbone_continue.py"},
        "world": str(a.world.resolve()), **_world_record(a.world), "metrics": metrics})
    (a.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
