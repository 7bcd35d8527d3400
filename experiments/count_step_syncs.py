"""Issue 43's figure: host reads and collectives per FoCo training step on the data-parallel path, stage 1 and 2,
counted by `foco.utils.syncs.StepCounter` (this checkout's) on a gloo process group of one, for the foco in --repo
(another checkout, e.g. `git worktree add /tmp/before 6c232ee`, for the figure before). The step's marginal cost is
the difference between runs of 4 and 8 steps per stage.

    python experiments/count_step_syncs.py                       # this checkout
    python experiments/count_step_syncs.py --repo /tmp/before    # an older one (its data-parallel path is forced)
    python experiments/count_step_syncs.py --device cuda         # nccl; torch's sync debug mode counts real syncs
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=str(HERE), help="the checkout whose training step is counted")
    ap.add_argument("--sync-every", type=int, default=4)
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, and the real syncs counted)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(a.repo) / "src"))
    import torch
    import torch.distributed as dist
    spec = importlib.util.spec_from_file_location("counter", HERE / "src/foco/utils/syncs.py")
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)
    from foco.train import distributed as fd
    from foco.train.foco import FoCoTrainConfig, train_foco
    sys.path.insert(0, str(HERE / "tests"))
    from test_step_budget import B, _table
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(fd._free_port() if hasattr(fd, "_free_port") else 29533))
    cuda = a.device.startswith("cuda")
    device = a.device if not cuda or ":" in a.device else f"cuda:{torch.cuda.current_device()}"  # nccl needs an index
    if cuda:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60),
                            **({"device_id": torch.device(device)} if cuda else {}))
    forced = "forced" in fd.RunContext.__dataclass_fields__
    if forced:
        env = fd.RunContext(device=device, forced=True)
    else:  # an older foco: its data-parallel path taken at world size 1
        fd.RunContext.enabled = property(lambda self: True)
        env = fd.RunContext(device=device)
    watched = ("train/loop.py", "train/foco.py", "train/losses.py", "train/distributed.py", "model/")
    root = Path(a.repo).resolve() / "src" / "foco"
    fields = FoCoTrainConfig.__dataclass_fields__
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (4, 8):
            kw = {"sync_every": a.sync_every} if "sync_every" in fields else {}
            cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=B, device=device, **kw)
            c = counter.StepCounter()
            c.files = tuple(str(root / f) for f in watched)
            import warnings
            with c, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                train_foco(_table(n * B), Path(tmp) / f"r{n}", cfg, ctx=env.for_run(0, Path(tmp) / f"r{n}"))
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
            syncs = sum("synchroniz" in str(w.message) for w in caught)
            rows[n] = (dict(c.reads), dict(c.collectives), syncs)
    steps = 2 * 4
    out = {"repo": a.repo, "device": device, "sync_every": a.sync_every if "sync_every" in fields else "n/a (every step)"}
    for i, name in enumerate(("reads", "collectives")):
        diff = {k: (rows[8][i].get(k, 0) - rows[4][i].get(k, 0)) / steps for k in set(rows[8][i]) | set(rows[4][i])}
        out[name + "_per_step"] = round(sum(diff.values()), 3)
        out[name + "_by_kind"] = {k: round(v, 3) for k, v in sorted(diff.items()) if v}
    if cuda:  # what the GPU really waited for, per step (the sync debug mode's warnings)
        out["cuda_syncs_per_step"] = round((rows[8][2] - rows[4][2]) / steps, 3)
    print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
