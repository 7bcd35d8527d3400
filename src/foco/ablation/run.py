"""`foco ablate`: every ablation variant trained from the same seed and data, evaluated through the one evaluation
path, tabulated against the full model and the paper.

    OUT/ablate.json                         what the runs share (world, features, training budget); a rerun with
                                            other settings is refused
    OUT/<recipe>/<variant>/seed<s>/         a FoCo checkpoint (resumable), and result-<split>.json once evaluated
    OUT/features/train-rule/                the training features of the rule decompositions (3a), encoded once
    OUT/ablations.json, OUT/ablations.md    every table run so far, by recipe and split

Recipes: "paper" trains FoCo's two stages; "edits" (foco-edits) resumes each variant's paper run into the edit
stage on rule-written ITT triplets, the quickstart's recipe. The variants' switches act on the paper stages (the
model switches on every stage; the loss switches, K and the decompositions on stages 1-2, which the edit stage's
own losses follow); the edit triplets are the same for every variant.

A finished variant is not retrained, and an evaluated one is not evaluated again: a killed run resumes where it
stopped.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..utils.io import atomic_write_text, read_json
from .stats import MIN_SEEDS, mean_sd, sign_verdict
from .variants import Variant

log = logging.getLogger(__name__)

RECIPES = ("paper", "edits")
METRICS = ("R@1", "Rs@1", "mAP@10")


@dataclass
class AblateConfig:
    world: Path  # a world folder (the quickstart's OUT/world)
    features: Path  # its features: train/, and <split>-single/, <split>-multi/ (the quickstart's OUT/features)
    out: Path
    recipe: str = "paper"
    variants: list[Variant] = field(default_factory=list)
    split: str = "test"
    seeds: tuple[int, ...] = (0,)
    pairs: int | None = None  # train on this many of the world's training pairs (a fixed subset); None: all
    size: str = "default"  # the quickstart plan whose training settings every variant uses
    precision: str = "auto"
    max_steps: int | None = None  # cap on each stage's steps (smoke runs)
    batch_size: int | None = None  # examples per step instead of the plan's (smoke runs, a memory budget)
    device: str = "auto"  # foco.utils.device
    protocols: tuple[str, ...] = ("single", "multi")  # the world protocols evaluated (e.g. ("restaged",))

    @property
    def key(self) -> str:
        """What a result is of: the split, with the protocols when they are not the default pair ("test",
        "test-restaged")."""
        return self.split if self.protocols == ("single", "multi") else f"{self.split}-{'+'.join(self.protocols)}"


def run_ablation(cfg: AblateConfig) -> dict:
    """Trains and evaluates every (variant, seed) not done yet; returns the table of this recipe and split (also
    merged into OUT/ablations.json and OUT/ablations.md)."""
    from ..backbones import create_backbone
    from ..train.recipes import quickstart_plan
    from ..utils.device import resolve_device
    from ..utils.precision import resolve_precision
    if cfg.recipe not in RECIPES:
        raise ValueError(f"--recipe {cfg.recipe!r}: choose one of {', '.join(RECIPES)}")
    out = Path(cfg.out)
    train_features = Path(cfg.features) / "train"
    for need in [train_features] + [Path(cfg.features) / f"{cfg.split}-{p}" for p in cfg.protocols]:
        if not (need / "manifest.json").is_file():
            raise FileNotFoundError(f"--features {cfg.features}: {need} is missing; run `foco quickstart` (it writes "
                                    f"train, val and test features) or `foco features extract --split "
                                    f"{cfg.split}/{need.name.split('-', 1)[1]}` for it")
    manifest = read_json(train_features / "manifest.json")
    plan = quickstart_plan(cfg.size)
    device = str(resolve_device(cfg.device))
    base = replace(plan.foco, precision=resolve_precision(cfg.precision, device), max_steps=cfg.max_steps,
                   batch_size=cfg.batch_size or plan.foco.batch_size, device=device)
    _check_settings(out, cfg, manifest["backbone"], base.precision)
    backbone = create_backbone(manifest["backbone"], device)
    data = _Data(cfg, backbone, train_features, manifest.get("precision", "fp32"), plan.edits, device)
    t0, todo = time.time(), [(v, s) for s in cfg.seeds for v in cfg.variants]
    for n, (variant, seed) in enumerate(todo, 1):
        where = f"[{n}/{len(todo)}] {cfg.recipe} {variant.name} seed {seed}"
        _run_one(cfg, data, variant, seed, replace(variant.apply(base), seed=seed), where)
    table = tabulate(cfg, _results(cfg))
    table["wall_s"] = round(time.time() - t0, 1)
    _write_tables(out, cfg.recipe, cfg.key, table)
    return table


class _Data:
    """The training data of every variant, built once: the pair tables (by decomposer, subset to --pairs) and,
    for the edits recipe, the edit triplets (by feature cache)."""

    def __init__(self, cfg: AblateConfig, backbone, train_features: Path, feature_precision: str, edit_plan,
                 device: str = "cpu"):
        self.cfg, self.backbone, self.edit_plan = cfg, backbone, edit_plan
        self.features = {"oracle": train_features}
        self.feature_precision = feature_precision
        self.decompositions: dict[str, dict] = {}
        self.tables: dict[str, object] = {}
        self.edits: dict[str, object] = {}
        self.keep: set[str] | None = None
        self.benchmark = _Benchmark(cfg.world, cfg.features, cfg.split, cfg.protocols, device)

    def _decompositions(self, decomposer: str) -> dict:
        from ..world.decompositions import world_decompositions
        if decomposer not in self.decompositions:
            if decomposer == "oracle":
                self.decompositions[decomposer] = world_decompositions(self.cfg.world, "train")
            else:
                self.decompositions[decomposer] = self._decompose(decomposer)
        return self.decompositions[decomposer]

    def _decompose(self, decomposer: str) -> dict:
        """The training captions decomposed by `decomposer` (into OUT/decompositions.sqlite) and their texts
        encoded with the backbone and precision of the training features (into OUT/features/train-<name>)."""
        from ..decompose import build_decomposer
        from ..decompose.inputs import read_captions
        from ..decompose.run import run_decompose
        from ..features import ExtractConfig
        from ..world.decompositions import world_decompositions
        from ..world.splits import extract_world_split
        store = Path(self.cfg.out) / "decompositions.sqlite"
        records = read_captions(self.cfg.world, split="train")
        run_decompose([r.caption for r in records], build_decomposer(decomposer, records), store, batch_size=256)
        decs = world_decompositions(self.cfg.world, "train", store, decomposer)
        folder = Path(self.cfg.out) / "features" / f"train-{decomposer}"
        extract_world_split(self.backbone, self.cfg.world, "train", folder,
                            ExtractConfig(precision=self.feature_precision), include_captions=False,
                            decompositions=decs)
        self.features[decomposer] = folder
        return decs

    def subset(self, ids: list[str]) -> set[str]:
        """The --pairs images: a fixed random subset (seed 0) of the training images, the same for every variant and
        seed; every image without --pairs."""
        if self.keep is None:
            n = self.cfg.pairs or len(ids)
            if n > len(ids):
                raise ValueError(f"--pairs {n}: the world has {len(ids)} training pairs")
            order = np.random.default_rng(0).permutation(len(ids))[:n]
            self.keep = {ids[i] for i in sorted(order.tolist())}
        return self.keep

    def table(self, decomposer: str):
        from ..train.data import build_pair_table
        if decomposer not in self.tables:
            decs = self._decompositions(decomposer)
            full = build_pair_table(self.features[decomposer], decs)  # the decompositions are this run's own
            self.tables[decomposer] = full.subset(self.subset(full.ids))
        return self.tables[decomposer]

    def edit_table(self, decomposer: str):
        """foco-edits' triplets, written from the oracle decompositions of the --pairs images, joined with the
        variant's training features."""
        from ..train.recipes import edit_triplets
        table = self.table(decomposer)
        if decomposer not in self.edits:
            out = Path(self.cfg.out)
            self.edits[decomposer] = edit_triplets(out / "edits.sqlite", out / "features" / "edit-texts",
                                                   self.features[decomposer], self._decompositions("oracle"),
                                                   self.backbone, self.edit_plan, table.ids,
                                                   self.feature_precision)
        return self.edits[decomposer]


def _run_one(cfg: AblateConfig, data: _Data, variant: Variant, seed: int, train_cfg, where: str) -> None:
    """Trains (or resumes) and evaluates one variant and seed, unless done."""
    from ..train.foco import train_foco
    folder = Path(cfg.out) / cfg.recipe / variant.name / f"seed{seed}"
    result = folder / f"result-{cfg.key}.json"
    sources = data.benchmark.sources()
    if result.is_file():
        recorded = read_json(result).get("sources")
        if recorded == sources:
            log.info("%s: done already (%s)", where, result)
            return
        log.info("%s: %s; evaluated again", where,
                 f"{result} records no sources (an older foco)" if recorded is None else
                 f"the benchmark changed since {result} was written (its parts' sources differ)")
    t0 = time.time()
    from ..backbones import backbone_record
    meta = {"backbone": data.backbone.spec, "provenance": {"backbone": backbone_record(data.backbone)},
            "ablation": {"variant": variant.name, "paper_id": variant.paper_id,
                         "pairs": len(data.table(variant.decomposer))}}
    paper_dir = Path(cfg.out) / "paper" / variant.name / f"seed{seed}"
    if not _trained(paper_dir, stage3=False):
        log.info("%s: training the paper recipe", where)
        train_foco(data.table(variant.decomposer), paper_dir, train_cfg, resume=True, meta=meta)
    if cfg.recipe == "edits" and not _trained(folder, stage3=True):
        from ..train.recipes import train_stage3
        log.info("%s: training the edit stage", where)
        train_stage3(data.table(variant.decomposer), paper_dir, folder, train_cfg, data.edit_plan,
                     data.edit_table(variant.decomposer), data.backbone.spec, meta)
    trained_s = time.time() - t0
    row = data.benchmark.evaluate(folder)
    atomic_write_text(result, json.dumps({"variant": variant.name, "seed": seed, "recipe": cfg.recipe,
                                          "split": cfg.split, "protocols": list(cfg.protocols), "sources": sources,
                                          "metrics": row, "train_s": round(trained_s, 1),
                                          "eval_s": round(time.time() - t0 - trained_s, 1)}, indent=2) + "\n")
    log.info("%s: %s (%.0f s)", where, ", ".join(f"{m} {row[m]:.2f}" for m in METRICS if m in row),
             time.time() - t0)


def _trained(folder: Path, stage3: bool) -> bool:
    meta = folder / "foco.json"
    return (folder / "foco.safetensors").is_file() and meta.is_file() and \
        (not stage3 or "recipe" in json.loads(meta.read_text()))


class _Benchmark:
    """The world's `split` and its features, read once and shared by every checkpoint's evaluation."""

    def __init__(self, world: Path, features: Path, split: str, protocols: tuple[str, ...] = ("single", "multi"),
                 device: str = "cpu"):
        from ..benchmarks.world import read_world, world_cache_features
        self.parts, self._source = read_world(world, split, protocols), world_cache_features(features)
        self.device = device  # where each checkpoint composes and ranks
        self._features = {}

    def sources(self) -> dict[str, dict]:
        """Each part's source (world fingerprint, described share, restaging strength and pictures), which a stored
        result must match to be reused."""
        return json.loads(json.dumps({b.name: b.source for b in self.parts}))  # as a result file holds them

    def features(self, bench):
        if bench.name not in self._features:
            self._features[bench.name] = self._source(bench)
        return self._features[bench.name]

    def evaluate(self, checkpoint: Path) -> dict:
        """The FoCo checkpoint's metrics on both protocols through the one evaluation path."""
        from ..eval.evaluate import EvalConfig, evaluate
        from ..methods import MethodOptions
        res = evaluate(self.parts, self.features, EvalConfig(methods=("foco",), by_category=True,
                                                             options=MethodOptions(checkpoint=checkpoint,
                                                                                   device=self.device)))
        by_type = {part: e["R@1_by_category"]["foco"] for part, e in res["parts"].items()
                   if "R@1_by_category" in e}
        return {**res["methods"]["foco"], "R@1_by_category": by_type}  # per edit type, per protocol


def _check_settings(out: Path, cfg: AblateConfig, backbone: str, precision: str) -> None:
    """One output folder holds runs of one world, one feature set and one training budget: a rerun with others is
    refused, naming the flag."""
    now = {"world": str(Path(cfg.world).resolve()), "features": str(Path(cfg.features).resolve()),
           "pairs": cfg.pairs, "size": cfg.size, "precision": precision, "max_steps": cfg.max_steps,
           "batch_size": cfg.batch_size, "backbone": backbone}
    path = out / "ablate.json"
    if path.is_file():
        saved = read_json(path)
        flags = {"world": "--world", "features": "--features", "pairs": "--pairs", "size": "--size",
                 "precision": "--precision", "max_steps": "--max-steps", "batch_size": "--batch-size",
                 "backbone": "--features"}
        diff = [f"{flags[k]} {saved.get(k)!r} (now {v!r})" for k, v in now.items() if saved.get(k) != v]
        if diff:
            raise ValueError(f"{out} holds ablation runs made with " + ", ".join(diff) +
                             "; rerun with those settings, or choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(now, indent=2) + "\n")


def _results(cfg: AblateConfig) -> dict[str, dict[int, dict]]:
    """variant -> seed -> metrics, for this recipe and split."""
    found: dict[str, dict[int, dict]] = {}
    for v in cfg.variants:
        for s in cfg.seeds:
            path = Path(cfg.out) / cfg.recipe / v.name / f"seed{s}" / f"result-{cfg.key}.json"
            found.setdefault(v.name, {})[s] = read_json(path)["metrics"]
    return found


def tabulate(cfg: AblateConfig, results: dict[str, dict[int, dict]]) -> dict:
    """Per variant: each metric's mean and sd over seeds, the paired R@1 delta against the full model (mean, sd,
    per seed), the paper's delta, whether the signs agree and whether ours counts beyond noise (`stats`)."""
    full = results["full"]
    metrics = [m for m in METRICS if all(m in r for r in full.values())]  # mAP@10 needs the multi protocol
    rows = []
    for v in cfg.variants:
        per_seed = results[v.name]
        row = {"variant": v.name, "paper_id": v.paper_id, "what": v.what, "seeds": sorted(per_seed), "k": v.k}
        for m in metrics:
            mean, sd = mean_sd([per_seed[s][m] for s in sorted(per_seed)])
            row[m] = {"mean": round(mean, 2), "sd": round(sd, 2)}
        if v.name != "full":
            deltas = [per_seed[s]["R@1"] - full[s]["R@1"] for s in sorted(per_seed)]
            mean, sd = mean_sd(deltas)
            row["delta_R@1"] = {"mean": round(mean, 2), "sd": round(sd, 2), "per_seed": [round(d, 2) for d in deltas]}
            row["paper_delta_R@1"] = v.paper_delta  # a quoted figure NOT in the seed (variants.py); None: none quoted
            row["in_paper"] = v.in_paper
            row["sign"] = sign_verdict(deltas, -1 if v.in_paper else 1)  # not in the paper: is it above the full?
        rows.append(row)
    ablated = [r for r in rows if r["variant"] != "full" and r.get("in_paper", True)]
    curve = k_curve(rows)
    return {"recipe": cfg.recipe, "split": cfg.key, "seeds": list(cfg.seeds), "pairs": cfg.pairs, "metrics": metrics,
            "size": cfg.size, "rows": rows, **({"k_curve": curve} if curve else {}),
            "signs": {"ablations": len(ablated), "agree": sum(r["sign"]["agrees"] for r in ablated),
                      "beyond_noise": sum(r["sign"]["counts"] for r in ablated), "min_seeds": MIN_SEEDS}}


def k_curve(rows: list[dict]) -> dict | None:
    """The K curve (the paper's Fig. 3) from a table's rows: each K's R@1 and mAP@10 (mean, sd), in K order, and
    the K with the highest mAP@10 (R@1 on protocols without mAP@10); None unless at least two K were run."""
    from .variants import PAPER_K_PEAK
    points = sorted((r for r in rows if r.get("k") is not None), key=lambda r: r["k"])
    if len({r["k"] for r in points}) < 2:
        return None
    shown = [m for m in ("R@1", "mAP@10") if m in points[0]]
    peak_by = "mAP@10" if "mAP@10" in shown else "R@1"
    return {"k": [r["k"] for r in points], "variants": [r["variant"] for r in points],
            **{m: {"mean": [r[m]["mean"] for r in points], "sd": [r[m]["sd"] for r in points]} for m in shown},
            "peak_by": peak_by, "peak_k": max(points, key=lambda r: r[peak_by]["mean"])["k"],
            "paper_peak_k": PAPER_K_PEAK}


def plot_k_curve(table: dict, path: Path) -> None:
    """The K curve as a figure: R@1 and mAP@10 (mean ± sd over seeds) against K, with the paper's shape marked
    (Fig. 3: a peak at K = 4 and lower values at K >= 6; the seed gives the shape, not the figures)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curve = table["k_curve"]
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    for metric, style in (("mAP@10", "o-"), ("R@1", "s--")):
        if metric not in curve:
            continue
        ax.errorbar(curve["k"], curve[metric]["mean"], yerr=curve[metric]["sd"], fmt=style, capsize=3,
                    label=f"{metric}, world {table['split']} (mean ± sd, seeds {', '.join(map(str, table['seeds']))})")
    ax.axvline(curve["paper_peak_k"], color="grey", ls=":", label=f"the paper's peak (Fig. 3, CIRCO mAP): "
               f"K = {curve['paper_peak_k']}; lower at K >= 6")
    ax.set_xlabel("K, decomposition pairs per image")
    ax.set_ylabel("%")
    ax.set_xticks(curve["k"])
    ax.set_title(f"FoCo's K curve, recipe {table['recipe']}")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(table: dict) -> str:
    """The table as markdown: variant, R@1, Rs@1, mAP@10 (mean ± sd), our R@1 delta, the paper's, and the signs."""
    metrics = table.get("metrics", list(METRICS))
    lines = [f"### recipe {table['recipe']}, world {table['split']}, seeds {', '.join(map(str, table['seeds']))}"
             + (f", {table['pairs']} training pairs" if table.get("pairs") else ""), "",
             "| variant | paper | " + " | ".join(metrics) + " | ΔR@1 (ours) | paper's sign (the seed); CIRR ΔR@1 "
             "quoted, not in the seed | signs agree | beyond noise (t) |",
             "|---|---|" + "---|" * len(metrics) + "---|---|---|---|"]
    for r in table["rows"]:
        cells = [r["variant"], r["paper_id"]] + [f"{r[m]['mean']:.1f} ± {r[m]['sd']:.1f}" for m in metrics]
        if r["variant"] == "full":
            cells += ["", "", "", ""]
        else:
            d, s = r["delta_R@1"], r["sign"]
            paper = "< 0" if r["paper_delta_R@1"] is None else f"< 0 ({r['paper_delta_R@1']:+.1f}, not in the seed)"
            t = "" if s["t"] is None else f" ({s['t']})"
            if not r.get("in_paper", True) and r.get("k") is not None:  # a point of the K curve: no sign to judge
                cells += [f"{d['mean']:+.1f} ± {d['sd']:.1f}", "Fig. 3 (the curve below)", "", ""]
            elif not r.get("in_paper", True):  # a reading: no paper sign; "beyond noise" asks whether it beats full
                cells += [f"{d['mean']:+.1f} ± {d['sd']:.1f}", "not in the paper", "",
                          ("above full: " + ("yes" if s["counts"] else "no")) + t]
            else:
                cells += [f"{d['mean']:+.1f} ± {d['sd']:.1f}", paper, "yes" if s["agrees"] else "no",
                          ("yes" if s["counts"] else "no") + t]
        lines.append("| " + " | ".join(cells) + " |")
    s = table["signs"]
    readings = [r for r in table["rows"] if r["variant"] != "full" and not r.get("in_paper", True)
                and r.get("k") is None]
    if s["ablations"] or not readings:
        lines += ["", f"{s['agree']} of {s['ablations']} signs agree with the paper; {s['beyond_noise']} beyond "
                      f"noise (a paired one-sided t at 95 %, over at least {s['min_seeds']} seeds)."]
    if readings:
        lines += ["", f"{sum(r['sign']['counts'] for r in readings)} of {len(readings)} variants outside the paper's "
                      "table are above full beyond noise (a paired one-sided t at 95 %)."]
    if table.get("k_curve"):
        c = table["k_curve"]
        by = c.get("peak_by", "mAP@10")
        lines += ["", f"K curve ({by} by K): " + ", ".join(f"K = {k}: {m:.1f} ± {sd:.1f}" for k, m, sd in
                                                        zip(c["k"], c[by]["mean"], c[by]["sd"]))
                  + f"; highest at K = {c['peak_k']} (the paper's Fig. 3: K = {c['paper_peak_k']})."]
    if "wall_s" in table:
        lines.append(f"Wall time of this command: {table['wall_s'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def _write_tables(out: Path, recipe: str, split: str, table: dict) -> None:
    path = out / "ablations.json"
    tables = read_json(path) if path.is_file() else {}
    tables.setdefault(recipe, {})[split] = table
    atomic_write_text(path, json.dumps(tables, indent=2) + "\n")
    md = ["# FoCo ablations (`foco ablate`)", ""]
    for r in tables:
        for sp in tables[r]:
            md.append(markdown(tables[r][sp]))
    atomic_write_text(out / "ablations.md", "\n".join(md))
    if table.get("k_curve"):
        plot_k_curve(table, out / f"k-curve-{recipe}-{split}.png")

