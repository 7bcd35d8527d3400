"""OACIR on the world (issue 44): the benchmark's statistics, the method table on test (3 seeds for the trained
methods), the seed's ablations, box robustness, the fixed-beta sweep and a qualitative figure.

    foco world generate --out runs/w --size default --seed 0 && foco world oacir --world runs/w
    for s in train val test; do foco features extract --backbone world:vit --world runs/w --split $s/oacir \
        --out runs/feats/$s-oacir --precision auto; done
    python experiments/oacir_table.py --world runs/w --features runs/feats --out runs/oacir \
        [--foco runs/quickstart/foco] [--pic2word runs/p2w] [--seeds 0,1,2] [--epochs 8]

Every trained model is one `foco adafocal train` run (`train_adafocal`), kept under OUT/runs/<name>/seed<k> and
reused on a rerun. Choices (slerp's alpha, FoCo's and the fixed variant's beta) are made on val by Avg (the mean of
R_ID@1, R@1 and R@5, OACIRR's ranking) and reported on test. The ROI-cropped baseline is the no-CAAM model trained
and evaluated with each reference replaced by its box, cropped to a square (padded, not stretched), no box.
Writes OUT/oacir.json, OUT/oacir.md and OUT/oacir_qualitative.png.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from foco.ablation.stats import mean_sd, sign_verdict
from foco.backbones import create_backbone
from foco.backbones.base import ImageFeatures
from foco.benchmarks.base import dilated_square_crop
from foco.benchmarks.world import load_world_part
from foco.eval.compose import compose
from foco.eval.rank import rank, score
from foco.eval.select import choose_on_val
from foco.features import FeatureCache, cache_fingerprint
from foco.methods import MethodOptions, build_method
from foco.methods.slerp import ALPHA
from foco.model.box import perturb_boxes
from foco.model.caam import CAAMConfig
from foco.train.adafocal import AdaFocalTrainConfig, quadruples_from_parts, train_adafocal
from foco.utils.io import load_image
from foco.world.oacir import oacir_statistics

METRICS = ("R_ID@1", "R@1", "R@5", "Avg")
FIXED_BETAS = (-2.0, 1.0, 2.0, 4.0, 8.0)  # the fixed modulation's sweep (0 is the no-CAAM model itself)
FOCO_BETAS = (-4.0, -2.0, 0.0, 1.0, 2.0, 4.0, 8.0)
# name -> (variant, CAAM settings): the seed's ablations around AdaFocal's default (MLP CRM, learnable probes,
# scalar beta, 2 layers, 8 probes)
ABLATIONS = {
    "pool+learnable": {"crm": "pool"}, "mlp+frozen": {"learnable_probes": False},
    "pool+frozen": {"crm": "pool", "learnable_probes": False}, "vector beta": {"beta": "vector"},
    **{f"{n} layers": {"layers": n} for n in (1, 3, 4)}, **{f"{n} probes": {"probes": n} for n in (2, 4, 16, 32)}}


def scores(method, bench, feats, attn_bias=None) -> dict:
    cq = compose(method, bench, feats, attn_bias=attn_bias)
    return {k: v for k, v in score(bench, rank(bench, feats.gallery_ids, feats.gallery, cq.query)).items()
            if k in METRICS}


def top(method, bench, feats, k: int = 5) -> list[list[str]]:
    cq = compose(method, bench, feats)
    r = rank(bench, feats.gallery_ids, feats.gallery, cq.query)
    return [[feats.gallery_ids[i] for i in row[:k].tolist()] for row in r.full]


def roi_part(bench, feats, backbone):
    """The part with each reference replaced by its box, cropped to a padded square, and no box."""
    box_of = {}
    for q in bench.queries:
        if box_of.setdefault(q.reference, q.box) != q.box:
            raise ValueError(f"reference {q.reference} carries two boxes: one crop per reference is assumed")
    refs = list(box_of)
    crops = []
    for r in refs:
        x0, y0, x1, y1 = box_of[r]
        crops.append(dilated_square_crop(load_image(bench.images[r].path), (x0, y0, x1 - x0, y1 - y0), 0.0))
    with torch.no_grad():
        enc = [backbone.encode_images(crops[s:s + 256]) for s in range(0, len(crops), 256)]
    refs_f = ImageFeatures(torch.cat([e.global_ for e in enc]), torch.cat([e.patches for e in enc]),
                           None if enc[0].norm is None else torch.cat([e.norm for e in enc]))
    return replace(bench, queries=[replace(q, box=None, box_size=None) for q in bench.queries]), \
        replace(feats, reference_ids=refs, references=refs_f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, required=True)
    ap.add_argument("--features", type=Path, required=True, help="holds train-oacir, val-oacir, test-oacir")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--foco", type=Path, default=None, help="a FoCo checkpoint (zero-shot reference)")
    ap.add_argument("--pic2word", type=Path, default=None, help="a Pic2Word mapper (zero-shot reference)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--ablation-seeds", default=None, help="seeds of the ablations (default: --seeds)")
    ap.add_argument("--part", choices=("main", "ablations", "all"), default="all",
                    help="main: statistics, the method table, the sweep, robustness and the figure (OUT/oacir.json); "
                         "ablations: the CAAM ablations (OUT/oacir_ablations.json); two processes may run one each")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    seeds = [int(s) for s in a.seeds.split(",")]
    abl_seeds = [int(s) for s in (a.ablation_seeds or a.seeds).split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    parts = {s: load_world_part(a.world, s, "oacir", a.features / f"{s}-oacir") for s in ("train", "val", "test")}
    train = quadruples_from_parts(*parts["train"])
    report: dict = {"world": str(a.world.resolve()), "backbone": parts["test"][1].backbone, "seeds": seeds,
                    "epochs": a.epochs}
    opts = MethodOptions(device="cpu")

    def run(name: str, seed: int, variant: str = "caam", caam: dict | None = None, beta: float = 0.0,
            data=train, tag: str | None = None):
        folder = a.out / "runs" / (tag or name) / f"seed{seed}"
        cfg = AdaFocalTrainConfig(variant=variant, caam=CAAMConfig(**(caam or {})), fixed_beta=beta,
                                  epochs=a.epochs, seed=seed, device="cpu", hard_negatives=True)
        want = {"variant": variant, "epochs": a.epochs, "seed": seed, "fixed_beta": beta, "hard_negatives": True,
                **{f"caam.{k}": v for k, v in (caam or {}).items()}}
        if (folder / "adafocal.json").is_file():  # reused only when it was trained as asked now
            had = json.loads((folder / "adafocal.json").read_text()).get("train", {})
            diff = {k: (had.get(k), v) for k, v in want.items() if had.get(k) != v}
            if diff:
                raise SystemExit(f"{folder} was trained with other settings {diff} (recorded, asked): remove it "
                                 "or choose another --out")
        else:
            cache = a.features / "train-oacir"
            meta = {"provenance": {"backbone": parts["train"][1].backbone, "features": {
                "path": str(cache.resolve()), "fingerprint": cache_fingerprint(FeatureCache(cache).manifest)}},
                "data": {"world": str(a.world.resolve()), "split": "train", "quadruples": len(data)}}
            train_adafocal(data, folder, cfg, resume=(folder / "train_state").exists(), meta=meta)
        return build_method("adafocal", opts=opts, adafocal=folder)

    def seeded(name: str, parts_eval=None, seeds_=None, **kw) -> dict:
        bench, feats = parts_eval or parts["test"]
        per = {s: scores(run(name, s, **kw), bench, feats) for s in (seeds_ or seeds)}
        return {"per_seed": per, **{m: mean_sd([p[m] for p in per.values()]) for m in METRICS}}

    if a.part in ("ablations", "all"):
        # the default row is the method table's AdaFocal (the main part trains it)
        abl = {n: seeded(n.replace(" ", "-"), seeds_=abl_seeds, caam=c) for n, c in ABLATIONS.items()}
        (a.out / "oacir_ablations.json").write_text(json.dumps({"seeds": abl_seeds, "ablations": abl}, indent=1,
                                                               default=str) + "\n")
        if a.part == "ablations":
            return

    # statistics: quadruples, distractors, and how often image-only's top-1 is the right instance
    image = build_method("image", opts=opts)
    report["statistics"] = {s: {**oacir_statistics(a.world, s), "image_only_R_ID@1": scores(image, *parts[s])["R_ID@1"]}
                            for s in ("train", "val", "test")}
    print(json.dumps(report["statistics"], indent=1))

    # zero-shot references, as they are (no box), and FoCo with foco's fixed beta chosen on val
    table: dict = {}
    for name in ("image", "text", "sum"):
        table[name] = scores(build_method(name, opts=opts), *parts["test"])
    alpha, _ = choose_on_val("slerp", ALPHA, opts, *parts["val"])
    table[f"slerp (alpha {alpha:g} on val)"] = scores(build_method("slerp", opts=opts, slerp_alpha=alpha),
                                                      *parts["test"])
    if a.pic2word:
        table["pic2word"] = scores(build_method("pic2word", opts=opts, pic2word=a.pic2word,
                                                backbone=create_backbone(parts["test"][1].backbone["spec"])),
                                   *parts["test"])
    if a.foco:
        foco = build_method("foco", opts=opts, checkpoint=a.foco)
        table["foco (no box)"] = scores(foco, *parts["test"])
        from foco.eval.compose import box_masks
        sweep = {}
        for beta in FOCO_BETAS:
            mask = box_masks(parts["val"][0], parts["val"][1].references.patches.shape[1]).float()
            sweep[beta] = scores(foco, *parts["val"], attn_bias=beta * mask)["Avg"]
        beta = max(sweep, key=lambda b: (sweep[b], -abs(b)))
        mask = box_masks(parts["test"][0], parts["test"][1].references.patches.shape[1]).float()
        table[f"foco + box (beta {beta:g} on val)"] = scores(foco, *parts["test"], attn_bias=beta * mask)
        report["foco_box_sweep_val_avg"] = sweep

    trained = {"AdaFocal (CAAM)": seeded("caam"), "baseline (no CAAM)": seeded("none", variant="none")}
    # the fixed modulation's sweep: one seed per beta on val and test, then the chosen beta over every seed
    fixed_val = {b: scores(run("fixed", seeds[0], variant="fixed", beta=b, tag=f"fixed{b:g}"), *parts["val"])
                 for b in FIXED_BETAS}
    fixed_test = {b: scores(run("fixed", seeds[0], variant="fixed", beta=b, tag=f"fixed{b:g}"), *parts["test"])
                  for b in FIXED_BETAS}
    best = max(fixed_val, key=lambda b: (fixed_val[b]["Avg"], -abs(b)))
    trained[f"fixed beta {best:g} (on val)"] = seeded("fixed", variant="fixed", beta=best, tag=f"fixed{best:g}")
    report["fixed_beta_sweep"] = {"val": fixed_val, "test": fixed_test, "chosen": best}
    backbone = create_backbone(parts["test"][1].backbone["spec"])
    roi_train = quadruples_from_parts(*roi_part(*parts["train"], backbone))
    roi_test = roi_part(*parts["test"], backbone)
    trained["ROI-cropped (no CAAM)"] = seeded("roi", parts_eval=roi_test, variant="none", data=roi_train)
    deltas = [trained["AdaFocal (CAAM)"]["per_seed"][s]["R_ID@1"] - trained["baseline (no CAAM)"]["per_seed"][s]
              ["R_ID@1"] for s in seeds]
    report["caam_vs_baseline_R_ID@1"] = {"deltas": deltas, **sign_verdict(deltas, +1)}
    report["zero_shot"], report["trained"] = table, trained

    # box robustness (Table 10): AdaFocal's models, the boxes perturbed at test time
    g = torch.Generator().manual_seed(0)
    bench, feats = parts["test"]
    boxes = torch.tensor([q.box for q in bench.queries])
    variants = {"1.00 original": bench}
    for label, iou, shift in (("0.80 scale", 0.8, False), ("0.50 scale + shift", 0.5, True)):
        moved = perturb_boxes(boxes, iou, shift, g).tolist()
        variants[label] = replace(bench, queries=[replace(q, box=tuple(b)) for q, b in zip(bench.queries, moved)])
    variants["NaN w/o box"] = replace(bench, queries=[replace(q, box=None) for q in bench.queries])
    report["robustness"] = {k: seeded("caam", parts_eval=(b, feats)) for k, b in variants.items()}

    report["seconds"] = round(time.time() - t0, 1)
    (a.out / "oacir.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    figure(a.out / "oacir_qualitative.png", parts["test"], run("caam", seeds[0]), run("none", seeds[0], variant="none"))
    abl_file = a.out / "oacir_ablations.json"
    if abl_file.is_file():
        abl = json.loads(abl_file.read_text())
        report.update(ablations=abl["ablations"], ablation_seeds=abl["seeds"])
    (a.out / "oacir.md").write_text(markdown(report))
    print(markdown(report))


def fmt(cell) -> str:
    if isinstance(cell, (tuple, list)):
        return f"{cell[0]:.2f} ± {cell[1]:.2f}"
    return f"{cell:.2f}"


def rows(entries: dict) -> str:
    out = ["| method | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for name, m in entries.items():
        out.append(f"| {name} | " + " | ".join(fmt(m[k]) for k in METRICS) + " |")
    return "\n".join(out)


def markdown(r: dict) -> str:
    parts = ["## Statistics", "| split | quadruples | gallery | instance distractors / query (mean, min) | "
             "context distractors / query | image-only R_ID@1 |", "|---|---|---|---|---|---|"]
    for s, st in r["statistics"].items():
        parts.append(f"| {s} | {st['quadruples']} | {st['gallery']} | {st['instance_distractors_mean']:.1f}, "
                     f"{st['instance_distractors_min']} | {st['context_distractors_mean']:.1f} | "
                     f"{st['image_only_R_ID@1']:.2f} |")
    parts += ["", "## Test (trained: mean ± sd over seeds " + ",".join(map(str, r["seeds"])) + ")",
              rows({**r["zero_shot"], **r["trained"]}), "",
              f"CAAM - baseline, R_ID@1 per seed: {['%.2f' % d for d in r['caam_vs_baseline_R_ID@1']['deltas']]}; "
              f"paired t {r['caam_vs_baseline_R_ID@1']['t']}, needed {r['caam_vs_baseline_R_ID@1']['needed']}",
              "", "## Fixed beta sweep (seed %d)" % r["seeds"][0],
              "| beta | val Avg | test R_ID@1 | test R@1 | test R@5 | test Avg |", "|---|---|---|---|---|---|"]
    for b, v in r["fixed_beta_sweep"]["val"].items():
        t = r["fixed_beta_sweep"]["test"][b]
        parts.append(f"| {b:g} | {v['Avg']:.2f} | {t['R_ID@1']:.2f} | {t['R@1']:.2f} | {t['R@5']:.2f} | "
                     f"{t['Avg']:.2f} |")
    parts += ["", "## Box robustness (AdaFocal, test)", rows(r["robustness"])]
    if "ablations" in r:
        per = {s: v for s, v in r["trained"]["AdaFocal (CAAM)"]["per_seed"].items() if int(s) in r["ablation_seeds"]}
        default = {m: mean_sd([p[m] for p in per.values()]) for m in METRICS}
        parts += ["", f"## Ablations (test, seeds {r['ablation_seeds']})",
                  rows({"default (mlp + learnable, scalar, 2 layers, 8 probes)": default, **r["ablations"]})]
    return "\n".join(parts) + "\n"


def figure(path: Path, part, ada, base, n: int = 4, k: int = 5) -> None:
    """The seed's Figure 6: per query, the baseline's and AdaFocal's top k; green the target, yellow the right
    instance in the wrong context, red the rest. The queries shown are the first where AdaFocal's top-1 is the
    target and the baseline's is not (as the seed's figure picks its examples), then the first others."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    bench, feats = part
    a_top, b_top = top(ada, bench, feats, k), top(base, bench, feats, k)
    picks = [i for i, q in enumerate(bench.queries) if a_top[i][0] in q.targets and b_top[i][0] not in q.targets][:n]
    picks += [i for i in range(len(bench.queries)) if i not in picks][:n - len(picks)]
    fig, axes = plt.subplots(2 * len(picks), k + 1, figsize=(1.6 * (k + 1), 1.8 * 2 * len(picks)))
    for row, i in enumerate(picks):
        q = bench.queries[i]
        for sub, (label, ranked) in enumerate((("Baseline", b_top[i]), ("AdaFocal", a_top[i]))):
            ax = axes[2 * row + sub]
            ax[0].imshow(load_image(bench.images[q.reference].path))
            x0, y0, x1, y1 = q.box
            ax[0].add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="yellow", linewidth=1.5))
            ax[0].set_title(f"{label}: {q.texts[0]}"[:38], fontsize=6)
            for j, gid in enumerate(ranked):
                colour = ("green" if gid in q.targets else "gold" if q.instance in bench.instances.get(gid, ())
                          else "red")
                ax[j + 1].imshow(load_image(bench.images[gid].path))
                for side in ax[j + 1].spines.values():
                    side.set_edgecolor(colour)
                    side.set_linewidth(3)
            for x in ax:
                x.set_xticks([])
                x.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
