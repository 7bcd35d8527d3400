"""Issue 54: why zero-shot FoCo does not compose on the world. One FoCo run of the demo's recipe with overrides,
with a val curve after every epoch (val R@1 on `single`, `described`, `restaged`: `foco.eval.val_curve`) and the
image route in training: how much of L_comp's positive term F_Comp's visual tokens alone satisfy, on a fixed sample
of 512 training images, after every epoch. At the end the test R@1 of the same protocols is *reported* (never read
by a choice: choices read val, docs/benchmarks.md "Choosing FoCo's recipe on val").

    # once: the quickstart's world and features, and the described and restaged protocols with their features
    foco quickstart --out runs/quickstart
    foco world describe --world runs/quickstart/world --share 0.85
    foco world restage --world runs/quickstart/world --strength 0.5 --share 0.9
    for s in val/described val/restaged test/described test/restaged; do foco features extract --backbone world:vit \
        --world runs/quickstart/world --split $s --out runs/quickstart/features/${s/\\//-} --precision auto; done
    # a run: JSON overrides of the demo's FoCoTrainConfig ("model": FoCoConfig fields)
    python experiments/foco_diagnosis.py --run runs/quickstart --out runs/diag/siglip-5e-2-s0 --seed 0 \
        --config '{"lr_temperature": 0.05}'
    python experiments/foco_diagnosis.py --run runs/quickstart --baselines --out runs/diag/baselines

Writes OUT/diagnosis.json (config, per-epoch val curve and image route, final val and test R@1, train seconds) beside
the checkpoint. A finished run is skipped.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from foco.methods import build_method
from foco.train.data import build_pair_table
from foco.train.foco import FoCoTrainConfig, train_foco
from foco.train.recipes import quickstart_plan
from foco.eval.val_curve import ValCurve
from foco.utils.io import atomic_write_text
from foco.world.manifest import load_pairs

PROTOCOLS = ("single", "described", "restaged")
BASELINES = ("image", "text", "sum", "slerp")


def paired_table(folders: list[Path], against: str) -> str:
    """Each group's paired differences against the group `against`, seed by seed (mean ± sample sd over the seeds
    both ran): val mean, test described, test restaged, test single."""
    import re
    import statistics
    runs: dict[str, dict[int, dict]] = {}
    for f in folders:
        path = f / "diagnosis.json"
        if path.is_file() and "curve" in (r := json.loads(path.read_text())):
            runs.setdefault(re.sub(r"-s\d+$", "", f.name), {})[r["seed"]] = r
    base = runs.get(against, {})
    cols = (("val", "mean"), ("test", "described"), ("test", "restaged"), ("test", "single"))
    lines = [f"| lever minus {against} (paired by seed) | seeds | " + " | ".join(f"Δ {a} {b}" for a, b in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for name, by_seed in runs.items():
        if name == against:
            continue
        seeds = sorted(set(by_seed) & set(base))
        if not seeds:
            continue
        cells = []
        for a, b in cols:
            d = [by_seed[s][a][b] - base[s][a][b] for s in seeds]
            cells.append(f"{statistics.mean(d):+.1f} ± {statistics.stdev(d):.1f}" if len(d) > 1 else f"{d[0]:+.1f}")
        lines.append(f"| {name} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_table(folders: list[Path]) -> str:
    """A Markdown table of finished runs, grouped by name without its "-sN" seed suffix: val and test R@1 per
    protocol, mean ± sample sd over the group's seeds, the seed count and the final tau_comp and b_comp."""
    import re
    import statistics
    groups: dict[str, list[dict]] = {}
    for f in folders:
        path = f / "diagnosis.json"
        if path.is_file() and "test" in (r := json.loads(path.read_text())) and "curve" in r:
            groups.setdefault(re.sub(r"-s\d+$", "", f.name), []).append(r)
    fmt = lambda xs: f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"  # noqa
    head = "| run | seeds | " + " | ".join(f"val {p}" for p in PROTOCOLS) + " | **val mean** | " + \
        " | ".join(f"test {p}" for p in PROTOCOLS) + " | tau_comp, b_comp at the end |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, rs in groups.items():
        temps = rs[0]["curve"][-1]["temperatures"]
        cells = [fmt([r["val"][p] for r in rs]) for p in PROTOCOLS] + [f"**{fmt([r['val']['mean'] for r in rs])}**"] + \
            [fmt([r["test"][p] for r in rs]) for p in PROTOCOLS]
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) +
                     f" | {temps.get('tau_comp')}, {temps.get('bias_comp')} (seed {rs[0]['seed']}) |")
    return "\n".join(lines)


def demo_config(overrides: dict, seed: int) -> FoCoTrainConfig:
    """The demo's FoCo recipe (`quickstart_plan("default")`) with `overrides` and `seed`; precision auto, as the
    demo trains."""
    base = quickstart_plan("default").foco
    model = replace(base.model, **overrides.get("model", {}))
    top = {k: v for k, v in overrides.items() if k != "model"}
    return replace(base, **top, model=model, seed=seed, precision="auto")


@torch.inference_mode()
def image_route(model, table, rows: torch.Tensor) -> dict[str, float]:
    """L_comp's positive term on the training images `rows`: the mean cosine <h, v_g> and the mean phi+ (with the
    model's scale and bias) of every (local, context) pair, with F_Comp reading everything ("full"), the visual
    tokens alone (the context's tokens masked out: "visual"), and the context alone (v_loc and the background
    zeroed: "text")."""
    from foco.train.losses import _scale
    model.eval()
    batch = table.batch(rows).on(next(model.parameters()).device)
    b, K, D = batch.local.shape
    v, bg, _ = model.aggr(batch.local, batch.image_global, batch.patches)  # (b, K, D) x2
    L = batch.ctx_tokens.shape[2]
    v, bg = v.reshape(b * K, 1, D), bg.reshape(b * K, 1, D)
    tokens, mask = batch.ctx_tokens.reshape(b * K, L, D), batch.ctx_mask.reshape(b * K, L)
    keep = batch.local_mask.reshape(-1)
    target = batch.image_global[:, None, :].expand(b, K, D).reshape(b * K, D)
    s, bias = _scale(model.log_scale_comp), model.bias_comp
    out = {}
    for name, args in (("full", (v, bg, tokens, mask)), ("visual", (v, bg, tokens, torch.zeros_like(mask))),
                       ("text", (torch.zeros_like(v), torch.zeros_like(bg), tokens, mask))):
        h = model.comp(*args)[:, 0]  # (b*K, D)
        cos = (h * target).sum(-1)[keep]
        out[f"cos {name}"] = round(float(cos.mean()), 4)
        out[f"phi+ {name}"] = round(float(F.logsigmoid(s * cos + bias).mean()), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a quickstart folder: world/, features/{train,val-*,test-*}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default="{}", help="JSON overrides of the demo's FoCoTrainConfig")
    ap.add_argument("--baselines", action="store_true", help="score the training-free baselines instead")
    ap.add_argument("--method", default="foco", choices=("foco", "pic2word", "lincir"),
                    help="pic2word, lincir: train that baseline with its command's defaults (and --seed) on the "
                         "training folder instead, then score it (the data-scale curve)")
    ap.add_argument("--baseline-args", default="",
                    help="with --method pic2word or lincir: flags passed to its train command (the tuning budget's "
                         "settings, e.g. '--epochs 6'), recorded in diagnosis.json")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--train-run", default=None,
                    help="train on this folder's world/ and features/train instead (a world generated with "
                         "--train-pairs N: its val and test are --run's, scene for scene); scored on --run's")
    ap.add_argument("--table", nargs="+", default=None, metavar="RUN",
                    help="print the Markdown table of these finished runs (grouped by name without -sN) and exit")
    ap.add_argument("--against", default=None, help="with --table: paired differences against this run group")
    a = ap.parse_args()
    if a.table:
        print(markdown_table([Path(x) for x in a.table]))
        if a.against:
            print()
            print(paired_table([Path(x) for x in a.table], a.against))
        return
    run, out = Path(a.run), Path(a.out)
    protocols = tuple(a.protocols.split(","))
    if (out / "diagnosis.json").is_file():
        print(f"{out}: done")
        return
    val = ValCurve.world(run / "world", run / "features", protocols, None)
    test = _test_parts(run, protocols)
    if a.baselines:
        res = {m: {"val": val.score(build_method(m)), "test": test.score(build_method(m))} for m in BASELINES
               if m != "slerp"}
        from foco.methods.slerp import ALPHA_GRID  # slerp's alpha chosen on val by the rule's score
        alpha = max(ALPHA_GRID, key=lambda x: val.score(build_method("slerp", slerp_alpha=x))["mean"])
        res["slerp"] = {"alpha": alpha, "val": val.score(build_method("slerp", slerp_alpha=alpha)),
                        "test": test.score(build_method("slerp", slerp_alpha=alpha))}
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "diagnosis.json", json.dumps(res, indent=1) + "\n")
        print(json.dumps(res, indent=1))
        return
    overrides = json.loads(a.config)
    cfg = demo_config(overrides, a.seed)
    src = Path(a.train_run) if a.train_run else run
    if a.train_run:
        _check_same_benchmarks(src / "world", run / "world")
    if a.method != "foco":
        _baseline(a.method, src, out, a.seed, val, test, tuple(a.baseline_args.split()))
        return
    table = build_pair_table(src / "features" / "train",
                             {p.id: p.decomposition for p in load_pairs(src / "world", "train")})
    sample = torch.randperm(len(table), generator=torch.Generator().manual_seed(1234))[:512]
    curve = []

    def on_epoch(model, rec: dict) -> None:
        line = {k: rec[k] for k in ("stage", "epoch") if k in rec}
        line.update(loss={k: round(rec[k], 4) for k in ("aggr", "comp") if k in rec},
                    temperatures={k: round(rec[k], 4) for k in ("tau_aggr", "tau_comp", "bias_aggr", "bias_comp")
                                  if k in rec})
        from foco.methods.foco import FoCoMethod
        line["val R@1"] = val.score(FoCoMethod(model))
        if rec.get("stage") == 2:
            line["image route"] = image_route(model, table, sample)
        curve.append(line)
        print(json.dumps(line), flush=True)

    t = time.time()
    model = train_foco(table, out, cfg, resume=(out / "train_state").exists(), on_epoch=on_epoch)
    from foco.methods.foco import FoCoMethod
    res = {"config": overrides, "seed": a.seed, "train pairs": len(table), "train_s": round(time.time() - t, 1), "curve": curve,
           "val": val.score(FoCoMethod(model)), "test": test.score(FoCoMethod(model))}
    atomic_write_text(out / "diagnosis.json", json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("val", "test", "train_s")}))


def _baseline(method: str, src: Path, out: Path, seed: int, val: ValCurve, test: ValCurve,
              extra: tuple[str, ...] = ()) -> None:
    """A baseline trained by its own command on `src`'s training split (its defaults, and `extra` flags: the
    tuning budget's settings, e.g. --epochs 6), then scored."""
    from foco.cli import main as foco
    t = time.time()
    if method == "pic2word":
        argv = ["pic2word", "train", "--features", src / "features" / "train", "--out", out / "model", "--seed", seed]
    else:
        argv = ["lincir", "train", "--world", src / "world", "--split", "train", "--backbone", "world:vit",
                "--out", out / "model", "--seed", seed]
    argv += list(extra)
    if foco([str(x) for x in argv]) != 0:
        raise SystemExit(f"foco {' '.join(map(str, argv))} failed")
    from foco.backbones import create_backbone
    m = build_method(method, **{method: out / "model"}, backbone=create_backbone("world:vit"))
    res = {"method": method, "seed": seed, "args": list(extra), "train_s": round(time.time() - t, 1),
           "val": val.score(m), "test": test.score(m)}
    atomic_write_text(out / "diagnosis.json", json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))


def _check_same_benchmarks(a: Path, b: Path) -> None:
    """Refuses a training world whose val and test manifests differ from the scoring world's."""
    ha, hb = (json.loads((w / "world.json").read_text())["manifests_sha256"] for w in (a, b))
    bad = [k for k in hb if k.startswith("benchmarks/") and ha.get(k) != hb[k]]
    if bad:
        raise SystemExit(f"{a} and {b} differ in {', '.join(bad)}: --train-run must be the same world with another "
                         "--train-pairs")


def _test_parts(run: Path, protocols: tuple[str, ...]) -> ValCurve:
    """The test parts as a scorer (reported, never chosen on)."""
    from foco.benchmarks.world import load_world_part
    parts = {p: load_world_part(run / "world", "test", p, run / "features" / f"test-{p}") for p in protocols}
    return ValCurve(parts, None)


if __name__ == "__main__":
    main()
