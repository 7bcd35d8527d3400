"""What a trained Context-I2W mapper's word carries: the image, the context, or both (issue 57's reading).

    OMP_NUM_THREADS=1 python experiments/context_i2w_shortcut.py --run runs/quickstart --mapper runs/quickstart/context-i2w/plain-s0

On N training images (their own masked captions as contexts, the training condition), "a photo of *" with * = the
mapper's word must retrieve its image among the N (self-retrieval R@1, chance 1/N). Then the same with the contexts
rolled by one (each image read in another image's caption) and the images rolled by one (each caption with another
image): which of the two the word follows. Last, test references with the query prompt's context ("a photo of * ,
{modification}", the inference condition) and with "a photo of *" alone. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--mapper", type=Path, required=True)
    ap.add_argument("--n", type=int, default=256)
    a = ap.parse_args()
    from foco import create_backbone
    from foco.features import FeatureCache
    from foco.methods.context_i2w import ContextI2WMapper, image_tokens, raw_text
    from foco.train.context_i2w import context_pairs
    m = ContextI2WMapper.load(a.mapper)
    bb = create_backbone(json.loads((a.mapper / "context_i2w.json").read_text())["backbone"])
    n, out = a.n, {"n": a.n, "chance": 1 / a.n}

    def self_r1(c, x, v, target):
        with torch.no_grad():
            q = bb.encode_texts_with_tokens(["a photo of *"] * len(c), m(c, x), "*").global_
        return (torch.argmax(q @ v.T, 1) == target).float().mean().item()
    ids, f = FeatureCache(a.run / "features" / "train").images()
    _, contexts = context_pairs(a.run / "world")
    x = image_tokens(f.global_[:n], f.norm[:n], f.patches[:n], "train")
    with torch.no_grad():
        c = raw_text(bb, contexts[:n])
    idx = torch.arange(n)
    out["train: own caption"] = self_r1(c, x, f.global_[:n], idx)
    out["train: captions rolled, R@1 of the image read"] = self_r1(c.roll(1, 0), x, f.global_[:n], idx)
    out["train: captions rolled, R@1 of the caption's image"] = self_r1(c.roll(1, 0), x, f.global_[:n], idx.roll(1))
    out["train: images rolled, R@1 of the image read"] = self_r1(c, x.roll(1, 0), f.global_[:n], idx.roll(1))
    out["train: images rolled, R@1 of the caption's image"] = self_r1(c, x.roll(1, 0), f.global_[:n], idx)
    _, t = FeatureCache(a.run / "features" / "test-single").images()
    xt = image_tokens(t.global_[:n], t.norm[:n], t.patches[:n], "test")
    for ctx in ("a photo of *", "a photo of * , make it red"):
        with torch.no_grad():
            ct = raw_text(bb, [ctx] * n)
        out[f"test: context {ctx!r}"] = self_r1(ct, xt, t.global_[:n], idx)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
