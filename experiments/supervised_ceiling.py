"""A supervised ceiling for FoCo's architecture on the world: the same composed-query encoder (F_Aggr + F_Comp,
T_m as anchor and context), trained on (reference, modification, target) triplets instead of image-caption pairs.

This is *not* zero-shot and not a FoCo result. It answers one question: can the architecture, given the world's
backbone features, represent the edits of the benchmark at all? The triplets come from fresh scenes that no world
split uses (checked by layout key), with the benchmark's own edit sampler and phrasings; the loss is a sigmoid
contrastive loss between h(reference, T_m) and every target global feature of the batch.

    python experiments/supervised_ceiling.py --world runs/quickstart/world --backbone world:pretrained \
        --features runs/quickstart/features --out runs/ceiling --n 10000 --epochs 8 --foco runs/quickstart/foco
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from foco.backbones import create_backbone
from foco.backbones.base import ImageFeatures, TextFeatures
from foco.benchmarks.base import CIRBenchmark
from foco.benchmarks.world import load_world_part
from foco.eval.compose import compose
from foco.eval.rank import rank, score, score_by_category
from foco.methods import build_method
from foco.methods.foco import FoCoMethod
from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.utils.io import iter_jsonl
from foco.world.captions import CaptionChoice, caption_scene
from foco.world.edits import PHRASINGS, applicable_types, apply_edit, edit_text, sample_edit
from foco.world.render import render_scene
from foco.world.scene import Scene, sample_scene


def world_layouts(world: Path) -> set:
    keys = set()
    for path in list((world / "pairs").glob("*.jsonl")) + list((world / "benchmarks").glob("*/*/gallery.jsonl")):
        for _, rec in iter_jsonl(path):
            keys.add(Scene.from_dict(rec["scene"]).layout_key())
    return keys


def make_triplets(n: int, taken: set, seed: int) -> list[tuple[Scene, str, Scene]]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        ref = sample_scene(rng)
        if ref.layout_key() in taken:
            continue
        edit = sample_edit(rng, ref, str(rng.choice(applicable_types(ref))))
        target = apply_edit(ref, edit)
        if target.layout_key() in taken:
            continue
        out.append((ref, edit_text(ref, edit, int(rng.integers(len(PHRASINGS[edit.type])))), target))
    return out


def encode(backbone, triplets, chunk: int = 256):
    refs_g, refs_p, tg, texts = [], [], [], []
    for s in range(0, len(triplets), chunk):
        part = triplets[s:s + chunk]
        r = backbone.encode_images([render_scene(t[0]) for t in part])
        refs_g.append(r.global_), refs_p.append(r.patches)
        tg.append(backbone.encode_images([render_scene(t[2]) for t in part]).global_)
        texts.append(backbone.encode_texts([t[1] for t in part]))
    L = max(t.tokens.shape[1] for t in texts)
    tok = torch.cat([F.pad(t.tokens, (0, 0, 0, L - t.tokens.shape[1])) for t in texts])
    mask = torch.cat([F.pad(t.mask, (0, L - t.mask.shape[1])) for t in texts])
    return (ImageFeatures(torch.cat(refs_g), torch.cat(refs_p)), torch.cat(tg),
            TextFeatures(torch.cat([t.global_ for t in texts]), tok, mask))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", required=True)
    ap.add_argument("--backbone", required=True)
    ap.add_argument("--features", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--foco", default=None, help="a zero-shot FoCo checkpoint to score beside the ceiling")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(a.seed)
    t0 = time.time()
    backbone = create_backbone(a.backbone)  # encodes the triplets (unless cached) and the oracle captions
    cache = out / f"triplets-{a.n}-{a.seed}.safetensors"
    if cache.exists():
        t = load_file(str(cache))
        ref, tgt = ImageFeatures(t["ref_global"], t["ref_patches"]), t["target_global"]
        txt = TextFeatures(t["text_global"], t["text_tokens"], t["text_mask"])
    else:
        triplets = make_triplets(a.n, world_layouts(Path(a.world)), a.seed)
        ref, tgt, txt = encode(backbone, triplets)
        save_file({"ref_global": ref.global_, "ref_patches": ref.patches, "target_global": tgt,
                   "text_global": txt.global_, "text_tokens": txt.tokens, "text_mask": txt.mask}, str(cache))
    print(f"triplets ready in {time.time() - t0:.0f} s", flush=True)
    model = ComposedQueryEncoder(FoCoConfig(dim=tgt.shape[1], learn_bias=True))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.05)
    n, B = len(tgt), a.batch
    steps = a.epochs * (n // B)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, a.lr, total_steps=steps, pct_start=0.05)
    g = torch.Generator().manual_seed(a.seed)
    labels = 2 * torch.eye(B) - 1  # (B, B): +1 for each query's own target, -1 for the batch's other targets
    model.train()
    for epoch in range(a.epochs):
        perm, tot = torch.randperm(n, generator=g), 0.0
        for s in range(n // B):
            i = perm[s * B:(s + 1) * B]
            q = model.encode(ImageFeatures(ref.global_[i], ref.patches[i]),
                             TextFeatures(txt.global_[i], txt.tokens[i], txt.mask[i])).query  # (B, D)
            logits = model.log_scale_comp.exp().clamp(max=100) * q @ tgt[i].T + model.bias_comp  # (B, B)
            loss = -F.logsigmoid(labels * logits).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            tot += loss.item()
        print(f"epoch {epoch + 1}: loss {tot / (n // B):.3f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    model.save(out)
    res = {"triplets": n, "epochs": a.epochs, "train_s": round(time.time() - t0, 1)}
    for split in ("val", "test"):
        for proto in ("single", "multi"):
            bench, feats = load_world_part(a.world, split, proto, Path(a.features) / f"{split}-{proto}")
            rows = {name: compose(build_method(name), bench, feats).query for name in ("image", "text", "sum")}
            if a.foco:
                rows["foco (zero-shot)"] = compose(build_method("foco", a.foco), bench, feats).query
            rows["supervised ceiling"] = compose(FoCoMethod(model), bench, feats).query
            rows["target caption (oracle)"] = target_caption_queries(backbone, Path(a.world), split, proto, bench)
            for name, qv in rows.items():
                r = res.setdefault(split, {}).setdefault(name, {})
                ranked = rank(bench, feats.gallery_ids, feats.gallery, qv)
                r.update({k: round(v, 1) for k, v in score(bench, ranked).items()})
                if proto == "single":
                    r["R@1_by_edit_type"] = {k: round(v, 1) for k, v in score_by_category(bench, ranked).items()}
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


def target_caption_queries(backbone, world: Path, split: str, proto: str, bench: CIRBenchmark) -> torch.Tensor:
    """The text feature of a complete caption of each query's (first) target: what a perfect description of the
    wanted image retrieves with this backbone, with no reference image at all."""
    gallery = world / "benchmarks" / split / proto / "gallery.jsonl"
    scenes = {rec["id"]: Scene.from_dict(rec["scene"]) for _, rec in iter_jsonl(gallery)}
    rng = np.random.default_rng(0)
    caps = []
    for q in bench.queries:
        scene = scenes[q.targets[0]]
        caps.append(caption_scene(scene, CaptionChoice(rng, scene, partial=False))[0])
    return torch.cat([backbone.encode_texts(caps[s:s + 256]).global_ for s in range(0, len(caps), 256)])

if __name__ == "__main__":
    main()
