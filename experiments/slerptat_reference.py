"""foco's slerp against SlerpTAT's public code (youngkyunJang/SLERP-TAT), issue 57 item 4.

    git clone https://github.com/youngkyunJang/SLERP-TAT /tmp/slerptat-ref      # or any checkout of it
    python experiments/slerptat_reference.py --reference /tmp/slerptat-ref --out runs/slerptat-reference.json

The repository holds the composition alone (`slerp.py`, `slerp(v0, v1, t)`); the text-anchored tuning is not
public, so `foco.train.tat` follows the paper and there is no training code to compare. This runs the reference's
own function, imported from the checkout (nothing of it is copied into foco), and `foco.methods.slerp.slerp` on the
same unit vectors (the normalised globals both compose) at every alpha of foco's val grid:

1. random pairs of CLIP-sized unit vectors (D = 768), of a 512-d and the world's 256-d space;
2. near-parallel pairs (cos > 0.9995), where the reference switches to a normalised lerp and foco keeps slerp
   down to sin(theta) < 1e-6: the two formulas then differ by O(theta^2), printed as its own figure;
3. the endpoints: alpha 0 gives the image, 1 the text, in both.

Prints a JSON report (the reference's commit, the max absolute differences); exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from foco.methods.slerp import ALPHA_GRID, slerp


def reference_slerp(checkout: Path):
    spec = importlib.util.spec_from_file_location("slerptat_reference", checkout / "slerp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.slerp


def commit_of(checkout: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, required=True, help="a checkout of youngkyunJang/SLERP-TAT")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    a = ap.parse_args()
    ref = reference_slerp(a.reference)
    g = torch.Generator().manual_seed(0)
    report = {"reference": "youngkyunJang/SLERP-TAT", "commit": commit_of(a.reference), "alphas": len(ALPHA_GRID)}
    worst = {}
    for d in (768, 512, 256):
        v = F.normalize(torch.randn(4096, d, generator=g, dtype=torch.float64), dim=-1)
        t = F.normalize(torch.randn(4096, d, generator=g, dtype=torch.float64), dim=-1)
        worst[f"random pairs, D={d}"] = max(float((ref(v, t, al) - slerp(v, t, al).double()).abs().max())
                                            for al in ALPHA_GRID)
    v = F.normalize(torch.randn(1024, 768, generator=g, dtype=torch.float64), dim=-1)
    near = F.normalize(v + 0.02 * F.normalize(torch.randn(1024, 768, generator=g, dtype=torch.float64), dim=-1), dim=-1)
    assert bool(((v * near).sum(-1) > 0.9995).all())
    worst["near-parallel pairs (cos > 0.9995: the reference lerps)"] = max(
        float((ref(v, near, al) - slerp(v, near, al).double()).abs().max()) for al in ALPHA_GRID)
    report["max_abs_difference"] = worst
    v, t = v[:8].float(), F.normalize(torch.randn(8, 768, generator=g), dim=-1)
    ends = {"alpha 0 is the image": float((slerp(v, t, 0.0) - v).abs().max()),
            "alpha 1 is the text": float((slerp(v, t, 1.0) - t).abs().max()),
            "reference alpha 0": float((ref(v, t, 0.0) - v).abs().max()),
            "reference alpha 1": float((ref(v, t, 1.0) - t).abs().max())}
    report["endpoints"] = ends
    ok = all(x < 1e-5 for k, x in worst.items() if k.startswith("random")) and \
        worst["near-parallel pairs (cos > 0.9995: the reference lerps)"] < 1e-6 and all(x < 1e-5 for x in ends.values())
    report["ok"] = ok
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
