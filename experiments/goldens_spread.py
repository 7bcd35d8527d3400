"""How far another CPU moves the trainers' tiny runs (tests/test_same_checkpoints.py's tolerance comes from here).

    python experiments/goldens_spread.py [--out /tmp/goldens-spread] [--kinds native,avx2,sse42]

Each kernel kind is a fresh process with the environment that makes torch, MKL and oneDNN take that kind's kernels
(what another machine kind runs: another SIMD width gives another summation order). Each process generates the
tiny world, encodes its training split in fp32 (tests/trainer_runs.py), runs every trainer's tiny run from the CLI
on one thread, and writes the weights' digests. The report gives, for each kind against the first, how many tensors
are bit-identical and the largest relative sketch distance per trainer; `--write` records it in
tests/data/same_checkpoints-spread.json, which the test's tolerance cites.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

KINDS = {
    "native": {},  # what this CPU picks
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "sse42": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def one(out: Path) -> None:
    """In this process: world, fp32 features, every trainer; writes out/digest.json."""
    import torch
    from foco.cli import main
    from trainer_runs import build_train_features, digest_all, generate_small_world, run_every_trainer, write_json
    t0 = time.time()
    assert main(["world", "generate", "--out", str(out / "tiny"), "--size", "tiny"]) == 0
    features = build_train_features(out / "tiny", out / "feats")
    found = run_every_trainer(out / "tiny", features, out / "runs", generate_small_world(out / "small"))
    write_json(out / "digest.json", {"capability": torch.backends.cpu.get_cpu_capability(), "found": found,
                                     "seconds": round(time.time() - t0, 1), "runs": digest_all(out / "runs")})


def compare(a: dict, b: dict) -> dict:
    """{run: {"tensors", "identical", "max_distance", "worst"}} of b's runs against a's."""
    from trainer_runs import distance
    rep = {}
    for run, tensors in a["runs"].items():
        dists = {k: distance(b["runs"][run][k]["sketch"], v["sketch"]) for k, v in tensors.items()}
        worst = max(dists, key=dists.get)
        rep[run] = {"tensors": len(tensors),
                    "identical": sum(b["runs"][run][k]["sha256"] == v["sha256"] for k, v in tensors.items()),
                    "max_distance": dists[worst], "worst": worst, "per_tensor": dists}
    return rep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/goldens-spread")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, default=2, help="kinds run at once (each on one thread)")
    p.add_argument("--redigest", action="store_true",
                   help="digest the runs already in --out again (after a change of the digest) instead of training")
    p.add_argument("--write", action="store_true", help="record the report in tests/data/same_checkpoints-spread.json")
    a = p.parse_args()
    if a.one:
        return one(Path(a.one))
    out, kinds = Path(a.out), a.kinds.split(",")
    pending, running = ([] if a.redigest else list(kinds)), []
    if a.redigest:
        from trainer_runs import digest_all
        for k in kinds:
            d = json.loads((out / k / "digest.json").read_text())
            d["runs"] = digest_all(out / k / "runs")
            (out / k / "digest.json").write_text(json.dumps(d, indent=1) + "\n")
    while pending or running:
        while pending and len(running) < a.jobs:
            k = pending.pop(0)
            (out / k).mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **KINDS[k], "OMP_NUM_THREADS": "1"}
            log = open(out / k / "log.txt", "w")
            running.append((k, subprocess.Popen([sys.executable, __file__, "--one", str(out / k)], env=env,
                                                stdout=log, stderr=subprocess.STDOUT)))
        time.sleep(2)
        for k, proc in list(running):
            if proc.poll() is not None:
                running.remove((k, proc))
                if proc.returncode:
                    sys.exit(f"kind {k} failed: see {out / k / 'log.txt'}")
    digests = {k: json.loads((out / k / "digest.json").read_text()) for k in kinds}
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    import torch
    report = {"machine": f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}",
              "command": "python experiments/goldens_spread.py --write",
              "kinds": {k: {"env": KINDS[k], "capability": digests[k]["capability"], "seconds": digests[k]["seconds"],
                            "found": digests[k]["found"]} for k in kinds},
              "against": kinds[0], "spread": {k: compare(digests[kinds[0]], digests[k]) for k in kinds[1:]}}
    # each tensor's largest distance over the kinds: the test's tolerance is FACTOR times it (or its trainer's median)
    report["per_tensor"] = {run: {key: max(rep[run]["per_tensor"][key] for rep in report["spread"].values())
                                  for key in report["spread"][kinds[1]][run]["per_tensor"]}
                            for run in digests[kinds[0]]["runs"]}
    for rep in report["spread"].values():
        for r in rep.values():
            del r["per_tensor"]
    for k, rep in report["spread"].items():
        print(f"{k} against {kinds[0]}:")
        for run, r in rep.items():
            print(f"  {run:11s} {r['identical']:3d}/{r['tensors']:3d} bit-identical, largest distance "
                  f"{r['max_distance']:.2e} ({r['worst']})")
    worst = max(r["max_distance"] for rep in report["spread"].values() for r in rep.values())
    report["largest"] = worst
    print(f"largest distance between kinds: {worst:.2e}")
    if a.write:
        path = ROOT / "tests" / "data" / "same_checkpoints-spread.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
