"""Pic2Word as its reference code runs it, next to foco's earlier settings, on a quickstart run's world test benchmarks.

    OMP_NUM_THREADS=2 python experiments/pic2word_reference.py --run runs/quickstart

Three training settings, each with --seeds seeds, on RUN/features/train (the image globals and their norms):
  before     torch's AdamW defaults, the mapper reads the L2-normalised image embedding (the settings of
             docs/history.md's earlier Pic2Word figures and of experiments/field_table.py)
  optimizer  the reference's optimiser (AdamW betas (0.9, 0.98), eps 1e-6, no decay on biases and norms), normalised input
  reference  the reference's optimiser and its raw (unnormalised) mapper input: `foco pic2word train`'s defaults
Each mapper is scored on test single and multi with both query templates, SEARLE's "a photo of * that {}" and
Pic2Word's CIRR one "a photo of * , {}". Epochs and learning rate are field_table.py's (2, 5e-4), so "before" is the
published row's recipe. Writes RUN/pic2word-reference/{SETTING-sSEED}/ and results.json; reuses trained mappers.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from foco import create_backbone
from foco.ablation.stats import mean_sd
from foco.benchmarks.world import load_world_part
from foco.eval.compose import compose
from foco.eval.rank import score_queries
from foco.features import FeatureCache
from foco.methods.pic2word import Pic2WordConfig, Pic2WordMapper, Pic2WordMethod
from foco.train.pic2word import Pic2WordTrainConfig, train_pic2word
from foco.utils.io import atomic_write_text
from foco.utils.provenance import provenance

SETTINGS = {"before": ("adamw", "normalized"), "optimizer": ("reference", "normalized"),
            "reference": ("reference", "raw")}
SHOW = (("single", "R@1"), ("single", "R@5"), ("single", "Rs@1"), ("multi", "mAP@10"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/quickstart")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-4)
    a = ap.parse_args()
    run = Path(a.run)
    out = run / "pic2word-reference"
    backbone = create_backbone(json.loads((run / "foco" / "foco.json").read_text())["backbone"])  # the run's own
    _, train = FeatureCache(run / "features" / "train").images()
    if train.norm is None:
        raise SystemExit(f"{run / 'features' / 'train'} keeps no global norms: re-extract it with this foco")
    parts = {p: load_world_part(run / "world", "test", p, run / "features" / f"test-{p}") for p in ("single", "multi")}
    rows: dict = {}
    t0 = time.time()
    for name, (optimizer, mapper_input) in SETTINGS.items():
        for seed in range(a.seeds):
            d = out / f"{name}-s{seed}"
            if not (d / "pic2word.safetensors").is_file():
                cfg = Pic2WordTrainConfig(epochs=a.epochs, batch_size=128, lr=a.lr, optimizer=optimizer, seed=seed,
                                          model=Pic2WordConfig(mapper_input=mapper_input))
                train_pic2word(train.global_, backbone, d, cfg, resume=True, image_norm=train.norm)
            mapper = Pic2WordMapper.load(d)
            for template in ("searle", "pic2word-cirr"):  # names of TEMPLATES, resolved by the method
                method = Pic2WordMethod(mapper, backbone, template)
                res = {}
                for protocol, (bench, feats) in parts.items():
                    m = score_queries(compose(method, bench, feats).query, bench, feats.gallery_ids, feats.gallery)
                    res.update({f"{protocol} {k}": v for k, v in m.items()})
                rows.setdefault(f"{name} / {template}", []).append(res)
    summary = {k: {f"{p} {m}": [r[f"{p} {m}"] for r in v] for p, m in SHOW} for k, v in rows.items()}
    atomic_write_text(out / "results.json", json.dumps(
        {"run": str(run), "epochs": a.epochs, "lr": a.lr, "seeds": a.seeds, "per_seed": summary,
         "elapsed_s": round(time.time() - t0, 1), "machine": provenance()}, indent=2) + "\n")
    print("| setting / template | " + " | ".join(f"{p} {m}" for p, m in SHOW) + " |")
    print("|---|" + "---|" * len(SHOW))
    for k, cols in summary.items():
        cells = ["{:.1f} ± {:.1f}".format(*mean_sd(v)) for v in cols.values()]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
