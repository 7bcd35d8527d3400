"""The field side by side on a quickstart run: image / text / sum / slerp / Pic2Word / FoCo, each with cosine and
Chord scoring, on the world test benchmarks; then FoCo with and without box anchoring on the ambiguous variant.

    OMP_NUM_THREADS=1 python experiments/field_table.py --run runs/quickstart

Reads RUN/{world,foco,features/{train,test-single,test-multi}} (the backbone is the one RUN/foco/foco.json
records: `world:pretrained` for `make demo`'s runs, RUN/backbone for a --train-backbone run) and writes only under
RUN/field/:
val feature caches, the Pic2Word mapper, the ambiguous val and test splits (their own root,
RUN/field/ambiguous-world) and field_table.json. alpha (slerp), lambda (Chord, per method and protocol) and beta
(box anchoring) are chosen on val; the test table shows the whole beta sweep.
Every stage reuses what an earlier run left.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from foco import create_backbone
from foco.benchmarks.world import load_world_part
from foco.eval.box import evaluate_box_anchoring
from foco.eval.compose import compose, reference_rows
from foco.eval.rank import Chord, score_queries
from foco.eval.select import choose_alpha, choose_beta, choose_lambda
from foco.features import ExtractConfig, FeatureCache
from foco.methods import build_method
from foco.methods.pic2word import Pic2WordConfig, Pic2WordMethod
from foco.methods.slerp import SlerpMethod
from foco.model.box import patch_grid
from foco.train.pic2word import Pic2WordTrainConfig, train_pic2word
from foco.utils.io import atomic_write_text
from foco.world.ambiguous import generate_ambiguous_split, load_ambiguous, split_name
from foco.world.splits import extract_world_split

SHOW = {"single": ("R@1", "R@5", "R@10", "Rs@1"), "multi": ("mAP@5", "mAP@10")}


def _part(world: Path, split: str, protocol: str, cache: Path, backbone):
    """(bench, feats) of a world part, extracting its features into `cache` first if they are not there."""
    if not (cache / "manifest.json").is_file() or not FeatureCache(cache).manifest.get("texts"):
        extract_world_split(backbone, world, f"{split}/{protocol}", cache, ExtractConfig())
    return load_world_part(world, split, protocol, cache)


def _prompt_recall(method: Pic2WordMethod, backbone, image_global: torch.Tensor) -> float:
    """R@1 of image -> "a photo of *" among `image_global`'s own prompts (the training task, held-out images)."""
    with torch.no_grad():
        t = backbone.encode_texts_with_tokens(["a photo of *"] * len(image_global), method.mapper(image_global)).global_
    return 100.0 * (torch.argmax(image_global @ t.t(), 1) == torch.arange(len(t))).float().mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/quickstart")
    ap.add_argument("--p2w-epochs", type=int, default=2)
    ap.add_argument("--p2w-lr", type=float, default=5e-4)
    ap.add_argument("--ambiguous-queries", type=int, default=400)
    ap.add_argument("--betas", default="-8,-4,-2,-1,0,1,2,4,8")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run = Path(a.run)
    world, field = run / "world", run / "field"
    t0 = time.time()
    timings = {}
    backbone = create_backbone(json.loads((run / "foco" / "foco.json").read_text())["backbone"])  # the run's own

    # Pic2Word: trained on the FoCo training split's cached image features
    p2w_dir = field / "pic2word"
    if not (p2w_dir / "pic2word.safetensors").is_file():
        _, train_images = FeatureCache(run / "features" / "train").images()
        # the settings docs/history.md's Pic2Word figures were made with (normalised input, torch's AdamW), which
        # PACT's --mapper-init in the README reads; the reference's settings are `foco pic2word train`'s defaults
        cfg = Pic2WordTrainConfig(epochs=a.p2w_epochs, batch_size=128, lr=a.p2w_lr, optimizer="adamw",
                                  model=Pic2WordConfig(mapper_input="normalized"))
        train_pic2word(train_images.global_, backbone, p2w_dir, cfg, resume=True)
    pic2word = Pic2WordMethod.load(p2w_dir, backbone)
    timings["pic2word_train_s"] = round(time.time() - t0, 1)

    methods = {name: build_method(name) for name in ("image", "text", "sum")}
    results: dict = {"run": str(run), "methods": {}, "chosen": {}}
    t = time.time()
    for protocol in ("single", "multi"):
        val_bench, val_feats = _part(world, "val", protocol, field / "features" / f"val-{protocol}", backbone)
        test_bench, test_feats = load_world_part(world, "test", protocol, run / "features" / f"test-{protocol}")
        test_refs = test_feats.references.global_[reference_rows(test_bench, test_feats)].float()  # (Q, D)
        alpha, alpha_table = choose_alpha(val_bench, val_feats)
        results["chosen"][f"alpha/{protocol}"] = {"value": alpha, "val": alpha_table}
        for name, method in {**methods, "slerp": SlerpMethod(alpha), "pic2word": pic2word,
                             "foco": build_method("foco", run / "foco")}.items():
            q_val = compose(method, val_bench, val_feats).query  # (Q_val, D)
            q_test = compose(method, test_bench, test_feats).query  # (Q_test, D)
            lam, lam_table = choose_lambda(q_val, val_bench, val_feats)
            results["chosen"][f"lambda/{name}/{protocol}"] = {"value": lam, "val": lam_table}
            row = results["methods"].setdefault(name, {})
            row.update(score_queries(q_test, test_bench, test_feats.gallery_ids, test_feats.gallery))
            chord = score_queries(q_test, test_bench, test_feats.gallery_ids, test_feats.gallery, Chord(lam, test_refs))
            row.update({f"chord {k}": v for k, v in chord.items()})
        if protocol == "single":
            heldout = FeatureCache(run / "features" / "test-single").images()[1].global_[:512]
            results["pic2word_prompt_R@1_512_test_images"] = _prompt_recall(pic2word, backbone, heldout)
    timings["field_s"] = round(time.time() - t, 1)

    # the ambiguous variant: its own root beside the world, features in field/; beta chosen on val-ambiguous
    t = time.time()
    amb_root = field / "ambiguous-world"
    foco = build_method("foco", run / "foco")
    betas = [float(b) for b in a.betas.split(",")]
    grid = patch_grid(backbone.num_patches)
    amb = {}  # split -> (bench, feats, {beta: metrics})
    for split, n in (("val", a.ambiguous_queries // 2), ("test", a.ambiguous_queries)):
        if not (amb_root / "benchmarks" / split_name(split) / "single" / "queries.jsonl").is_file():
            generate_ambiguous_split(world, split, n_queries=n, out=amb_root)
        bench, feats = _part(amb_root, split_name(split), "single", field / "features" / f"{split}-ambiguous-single",
                             backbone)
        amb[split] = (bench, feats, evaluate_box_anchoring(foco, bench, feats, load_ambiguous(amb_root, split), grid,
                                                           betas))
    bench, feats, _ = amb["test"]
    results["ambiguous"] = {"queries": len(bench.queries), "gallery": len(bench.gallery_ids()),
                            "beta_chosen_on_val": choose_beta(amb["val"][2]),
                            "val_R@1": {str(b): m["R@1"] for b, m in amb["val"][2].items()},
                            "foco": {str(b): m for b, m in amb["test"][2].items()}}
    for name, method in {**methods, "pic2word": pic2word}.items():
        results["ambiguous"][name] = score_queries(compose(method, bench, feats).query, bench, feats.gallery_ids,
                                                   feats.gallery)
    timings["ambiguous_s"] = round(time.time() - t, 1)
    results["timings_s"] = {**timings, "total_s": round(time.time() - t0, 1)}
    atomic_write_text(field / "field_table.json", json.dumps(results, indent=2) + "\n")
    print(_table(results))


def _table(r: dict) -> str:
    cols = [*SHOW["single"], *SHOW["multi"]]
    lines = ["World test benchmarks (single: R@K, Rs@1; multi: mAP@K); cosine -> Chord (lambda chosen on val)", "",
             "| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, m in r["methods"].items():
        lines.append(f"| {name} | " + " | ".join(f"{m[c]:.1f} -> {m['chord ' + c]:.1f}" for c in cols) + " |")
    lines += ["", "chosen: " + ", ".join(f"{k}={v['value']}" for k, v in r["chosen"].items()),
              f"Pic2Word image -> 'a photo of *' R@1 among 512 test images: {r['pic2word_prompt_R@1_512_test_images']:.1f}",
              "", (f"Ambiguous test variant ({r['ambiguous']['queries']} queries, {r['ambiguous']['gallery']} gallery); "
                   f"beta chosen on val-ambiguous (R@1): {r['ambiguous']['beta_chosen_on_val']}"), "",
              "| method | R@1 | R@5 | Rs@1 | instance acc | attention in box |", "|---|---|---|---|---|---|"]
    for beta, m in r["ambiguous"]["foco"].items():
        lines.append(f"| foco beta={beta} | {m['R@1']:.1f} | {m['R@5']:.1f} | {m['Rs@1']:.1f} | "
                     f"{m['instance_acc']:.1f} | {m['attn_in_box']:.1f} |")
    for name in ("image", "text", "sum", "pic2word"):
        m = r["ambiguous"][name]
        lines.append(f"| {name} | {m['R@1']:.1f} | {m['R@5']:.1f} | {m['Rs@1']:.1f} | - | - |")
    lines += ["", f"timings: {r['timings_s']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
