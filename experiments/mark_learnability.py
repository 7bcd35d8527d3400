"""Can the world backbone's image tower see the marks at all? A supervised upper bound for issue 56's instance check.

The contrastive backbones stay at chance on the instance check (docs/benchmarks.md, "Does a backbone see
instances?"). This script separates the two possible causes:

* the pixels or the architecture cannot carry a mark (64 px images, 8 x 8 patches, a small shape's mark 4-6 px), or
* they can, and the contrastive objective gives the marks too little signal in the steps the CPU affords.

It trains a fresh image tower of `world:vit`'s shape (the same transformers CLIP vision model, randomly
initialised) with a linear head to name the mark of the one marked shape in a scene of 1-4 shapes (6 classes,
chance 16.7 %), by plain cross-entropy, and reports held-out accuracy by the marked shape's size as it trains.
Scenes are drawn by the world's own renderer from a seeded stream: random kinds, colours, sizes, cells, jitter-free,
backgrounds; the held-out scenes are never training scenes.

    python experiments/mark_learnability.py --steps 1200 --out runs/mark-learnability.json
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from foco.backbones.world import ViTTower, WorldBackboneConfig, uint8_to_input
from foco.world.render import render_scene
from foco.world.scene import Scene, WorldObject
from foco.world.vocab import BACKGROUNDS, COLOURS, GRID, MARKS, SHAPES, SIZES


def draw_scenes(n: int, seed: int, exclude: set | None = None) -> tuple[torch.Tensor, torch.Tensor, list[str], set]:
    """n scenes of 1-4 shapes with exactly one marked: (n, 64, 64, 3) uint8, (n,) mark labels, the marked
    shape's size per scene, and the set of scene keys drawn."""
    rng = random.Random(seed)
    imgs, labels, sizes, keys = [], [], [], set()
    while len(imgs) < n:
        k = rng.randint(1, GRID * GRID)
        cells = rng.sample(range(GRID * GRID), k)
        objs = [WorldObject(rng.choice(SHAPES), rng.choice(list(COLOURS)), rng.choice(list(SIZES)), c) for c in cells]
        i, mark = rng.randrange(k), rng.choice(MARKS)
        o = objs[i]
        objs[i] = WorldObject(o.kind, o.colour, o.size, o.cell, mark=mark)
        scene = Scene(rng.choice(list(BACKGROUNDS)), tuple(objs))
        key = repr(scene)
        if key in keys or (exclude and key in exclude):
            continue
        keys.add(key)
        imgs.append(np.asarray(render_scene(scene), dtype=np.uint8))
        labels.append(MARKS.index(mark))
        sizes.append(o.size)
    return torch.from_numpy(np.stack(imgs)), torch.tensor(labels), sizes, keys


def accuracy(tower: ViTTower, head: torch.nn.Linear, x: torch.Tensor, y: torch.Tensor, sizes: list[str]
             ) -> dict[str, float]:
    tower.eval()
    with torch.no_grad():
        pred = torch.cat([head(tower(uint8_to_input(x[i:i + 256]))[0]).argmax(-1) for i in range(0, len(x), 256)])
    tower.train()
    hit = (pred == y).float()
    out = {"all": round(100 * float(hit.mean()), 1)}
    for s in SIZES:
        m = torch.tensor([z == s for z in sizes])
        out[s] = round(100 * float(hit[m].mean()), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=20000, help="training scenes (drawn once, then epochs over them)")
    ap.add_argument("--test", type=int, default=1200, help="held-out scenes")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=200, help="evaluate every this many steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t0 = time.time()
    xt, yt, st, keys = draw_scenes(a.test, seed=10_000 + a.seed)
    x, y, _, _ = draw_scenes(a.train, seed=a.seed, exclude=keys)
    print(f"rendered {a.train} + {a.test} scenes in {time.time() - t0:.0f} s", flush=True)
    cfg = WorldBackboneConfig(image_tower="vit")  # world:vit's shape: 64 px, 8 x 8 patches, 4 x 192 wide
    tower, head = ViTTower(cfg), torch.nn.Linear(cfg.embed_dim, len(MARKS))
    params = list(tower.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.05, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, a.lr, total_steps=a.steps, pct_start=0.05)
    g = torch.Generator().manual_seed(a.seed)
    curve, t1 = [], time.time()
    for step in range(1, a.steps + 1):
        idx = torch.randint(len(x), (a.batch,), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(tower(uint8_to_input(x[idx]))[0])
        loss = F.cross_entropy(logits.float(), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % a.every == 0 or step == a.steps:
            acc = accuracy(tower, head, xt, yt, st)
            curve.append({"step": step, "scenes_seen": step * a.batch, "loss": round(float(loss.detach()), 4),
                          "held_out_%": acc, "seconds": round(time.time() - t1, 1)})
            print(json.dumps(curve[-1]), flush=True)
            a.out.parent.mkdir(parents=True, exist_ok=True)  # written at every evaluation: a stopped run keeps its curve
            a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                         "chance_%": round(100 / len(MARKS), 1), "curve": curve}, indent=2) + "\n")


if __name__ == "__main__":
    main()
