"""Calibrates the restaged protocol's strength and described share on val, with image, text and sum alone (issue 40).

    OMP_NUM_THREADS=2 python experiments/restaged_calibration.py --run runs/vit-seeds/seed-0

The rule, fixed before any trained method sees the protocol: on val, with the image-only, text-only and sum
baselines alone, on the default backbone (world:vit), choose the restaging strength and the described share so that
text-only R@1 / image-only R@1 comes within +-25 % of CIRR's 2.8 (20.9 / 7.4) and sum R@1 / image-only R@1 within
+-25 % of CIRR's 1.7 (12.4 / 7.4), both from Pic2Word's ViT-L/14 table. Among the settings that meet both, the one
whose two ratios are closest to CIRR's (the sum of the two relative distances); if none meets both, the closest
setting by the same measure is reported as outside the rule (with what stops it, docs/benchmarks.md) and is the
one written: the protocol is measured there, labelled.

For each point of the grid: `foco world restage --split val --force` into RUN/world, `foco features extract --split
val/restaged` into RUN/restaged-calibration/s-STRENGTH-p-SHARE/, `foco eval --protocols restaged --methods
image,text,sum`. The table goes to RUN/restaged-calibration/calibration.json (and Markdown on stdout); at a chosen
(or closest) setting, RUN/world's val and test restaged files are written at it. Resumable: a grid point with a result is read
back, not run again.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from foco.cli import main as foco
from foco.utils.io import atomic_write_text

CIRR_TEXT_IMAGE = 20.9 / 7.4  # 2.82
CIRR_SUM_IMAGE = 12.4 / 7.4  # 1.68
TOLERANCE = 0.25


def _run(argv: list[str]) -> None:
    code = foco(argv)
    if code != 0:
        raise SystemExit(f"foco {' '.join(argv)} exited {code}")


def _distance(row: dict) -> float:
    return abs(row["text / image"] / CIRR_TEXT_IMAGE - 1) + abs(row["sum / image"] / CIRR_SUM_IMAGE - 1)


def _inside(row: dict) -> bool:
    return (abs(row["text / image"] / CIRR_TEXT_IMAGE - 1) <= TOLERANCE
            and abs(row["sum / image"] / CIRR_SUM_IMAGE - 1) <= TOLERANCE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/vit-seeds/seed-0")
    ap.add_argument("--strengths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--shares", default="0.5,0.6,0.7,0.8,0.85,0.9,1")
    a = ap.parse_args()
    run = Path(a.run)
    world, out = run / "world", run / "restaged-calibration"
    backbone = json.loads((run / "foco" / "foco.json").read_text())["backbone"]
    rows = []
    t0 = time.time()
    for strength in [float(s) for s in a.strengths.split(",")]:
        for share in [float(s) for s in a.shares.split(",")]:
            folder = out / f"s-{strength:g}-p-{share:g}"
            result = folder / "val.json"
            if not result.is_file():
                _run(["world", "restage", "--world", str(world), "--strength", str(strength), "--share", str(share),
                      "--split", "val", "--force"])
                _run(["features", "extract", "--backbone", backbone, "--world", str(world), "--split",
                      "val/restaged", "--out", str(folder / "val-restaged")])
                _run(["eval", "--world", str(world), "--features", str(folder), "--split", "val", "--protocols",
                      "restaged", "--methods", "image,text,sum", "--out", str(result)])
            m = json.loads(result.read_text())["methods"]
            image, text, total = (m[k]["R@1"] for k in ("image", "text", "sum"))
            rows.append({"strength": strength, "share": share, "image R@1": image, "text R@1": text,
                         "sum R@1": total, "text / image": round(text / image, 2),
                         "sum / image": round(total / image, 2)})
    inside = [r for r in rows if _inside(r)]
    chosen = min(inside or rows, key=_distance)
    # the chosen setting, or the closest one outside the rule (labelled in calibration.json)
    _run(["world", "restage", "--world", str(world), "--strength", str(chosen["strength"]), "--share",
          str(chosen["share"]), "--force"])
    summary = {"rule": f"text/image and sum/image R@1 on val each within +-{TOLERANCE:.0%} of CIRR's "
                       f"{CIRR_TEXT_IMAGE:.2f} and {CIRR_SUM_IMAGE:.2f}; among those, the smallest sum of the two "
                       "relative distances",
               "rows": rows, "chosen": {"strength": chosen["strength"], "share": chosen["share"]},
               "within_rule": bool(inside), "cirr": {"text / image": round(CIRR_TEXT_IMAGE, 2),
                                                     "sum / image": round(CIRR_SUM_IMAGE, 2)},
               "backbone": backbone, "seconds": round(time.time() - t0, 1)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "calibration.json", json.dumps(summary, indent=2) + "\n")
    print("| strength | share | image R@1 | text R@1 | sum R@1 | text / image (CIRR 2.8) | sum / image (CIRR 1.7) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mark = " (chosen)" if r is chosen and inside else (" (closest)" if r is chosen else "")
        ok = " *" if _inside(r) else ""
        print(f"| {r['strength']:g}{mark} | {r['share']:g} | {r['image R@1']:.1f} | {r['text R@1']:.1f} | "
              f"{r['sum R@1']:.1f} | {r['text / image']:.2f} | {r['sum / image']:.2f}{ok} |")
    print(f"chosen strength {chosen['strength']:g}, share {chosen['share']:g}" if inside else
          f"NO setting on the grid meets both ratios; the closest is strength {chosen['strength']:g}, share "
          f"{chosen['share']:g}")


if __name__ == "__main__":
    main()
