"""Issue 54's figures from finished `experiments/foco_diagnosis.py` runs (matplotlib: `pip install foco[plot]`).

* the data-scale curve: test R@1 on `described` and `restaged` against training pairs for FoCo, Pic2Word and LinCIR
  (runs named METHOD-{10k,30k,100k}-sN; FoCo at 10k is the chosen recipe's runs, --foco-10k), with the training-free
  slerp and sum as flat lines (the baselines run);
* FoCo's curves: per epoch, the train losses and val R@1 (mean of the three protocols), and the image route (the
  cosine of F_Comp's output with the image's global, full input against the visual tokens alone), for the runs given.

    python experiments/foco_diagnosis_plots.py --diag runs/diag --foco-10k siglip-mod \
        --curves siglip-mod-s0,siglip-1e-2-s0,siglip-5e-2-s0,legacy-s0 --out docs/images
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

SIZES = {"10k": 10000, "30k": 30000, "100k": 100000}
PROTOCOLS = ("described", "restaged")


def _load(path: Path) -> dict | None:
    f = path / "diagnosis.json"
    return json.loads(f.read_text()) if f.is_file() else None


def scale_points(diag: Path, foco_10k: str) -> dict[str, dict[int, list[dict]]]:
    """{method: {pairs: [test scores of each seed]}}."""
    out: dict[str, dict[int, list[dict]]] = {}
    for d in sorted(diag.iterdir()):
        m = re.fullmatch(r"(foco|pic2word|lincir)-(10k|30k|100k)-s\d+", d.name)
        r = _load(d) if m else None
        if r:
            out.setdefault(m.group(1), {}).setdefault(SIZES[m.group(2)], []).append(r["test"])
    for d in sorted(diag.glob(f"{foco_10k}-s*")):
        r = _load(d)
        if r:
            out.setdefault("foco", {}).setdefault(10000, []).append(r["test"])
    return out


def plot_scale(diag: Path, foco_10k: str, out: Path) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = scale_points(diag, foco_10k)
    flat = _load(diag / "baselines") or {}
    fig, axes = plt.subplots(1, len(PROTOCOLS), figsize=(10, 4), sharey=True)
    table = {}
    for ax, proto in zip(axes, PROTOCOLS):
        for method, by_size in sorted(points.items()):
            xs = sorted(by_size)
            ys = [statistics.mean(s[proto] for s in by_size[x]) for x in xs]
            sds = [statistics.stdev(s[proto] for s in by_size[x]) if len(by_size[x]) > 1 else 0.0 for x in xs]
            ax.errorbar(xs, ys, yerr=sds, marker="o", capsize=3, label=method)
            table.setdefault(method, {})[proto] = {x: (round(y, 1), len(by_size[x])) for x, y in zip(xs, ys)}
        for name, style in (("slerp", "--"), ("sum", ":"), ("text", "-."), ("image", (0, (1, 3)))):
            if name in flat:
                ax.axhline(flat[name]["test"][proto], linestyle=style, color="grey", linewidth=1)
                ax.text(0.01, flat[name]["test"][proto], f"{name} ", va="bottom", fontsize=8, color="grey",
                        transform=ax.get_yaxis_transform())
        ax.set_xscale("log")
        ax.set_title(f"world test, {proto}")
        ax.set_xlabel("training pairs (log)")
    axes[0].set_ylabel("R@1")
    axes[0].legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "scale-curve.png", dpi=120)
    return table


def plot_curves(diag: Path, names: list[str], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for n, name in enumerate(names):
        r = _load(diag / name)
        if r is None:
            continue
        colour = f"C{n}"
        curve = r["curve"]
        x = list(range(1, len(curve) + 1))
        axes[0].plot(x, [c["loss"].get("aggr", 0) + c["loss"].get("comp", 0) for c in curve], marker="o", label=name,
                     color=colour)
        axes[1].plot(x, [c["val R@1"]["mean"] for c in curve], marker="o", label=name, color=colour)
        two = [(i, c["image route"]) for i, c in zip(x, curve) if "image route" in c]
        axes[2].plot([i for i, _ in two], [c["cos full"] for _, c in two], marker="o", label=f"{name}: full",
                     color=colour)
        axes[2].plot([i for i, _ in two], [c["cos visual"] for _, c in two], marker="x", linestyle="--",
                     label=f"{name}: visual alone", color=colour)
    axes[0].set_title("train loss (L_aggr + L_comp), per epoch")
    axes[1].set_title("val R@1, mean of single, described, restaged")
    axes[2].set_title("cos(F_Comp's output, the image's global)")
    for ax in axes:
        ax.set_xlabel("epoch (stage 1: 1-2, stage 2: 3-5)")
    axes[1].legend(fontsize=7)
    axes[2].legend(fontsize=6)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "foco-curves.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diag", default="runs/diag")
    ap.add_argument("--foco-10k", default="siglip-mod", help="the run name (without -sN) of FoCo's 10k points")
    ap.add_argument("--curves", default="siglip-mod-s0,siglip-1e-2-s0,siglip-5e-2-s0,legacy-s0")
    ap.add_argument("--out", default="docs/images")
    a = ap.parse_args()
    diag, out = Path(a.diag), Path(a.out)
    print(json.dumps(plot_scale(diag, a.foco_10k, out), indent=1))
    plot_curves(diag, a.curves.split(","), out)
    print(f"wrote {out / 'scale-curve.png'} and {out / 'foco-curves.png'}")


if __name__ == "__main__":
    main()
