"""Every trainer saves the weights it saved before: a change of any trainer's numbers fails here, on every CPU.

Every trainer runs a tiny job from the command line, as a user would (tests/trainer_runs.py, once per test run:
FoCo's two stages, foco-edits' edit stage with the target-image term, Pic2Word, PACT, TSCIR, LinCIR and the world
backbone), all of it in fp32, features included. The weights each one saves are held tensor by tensor against
`data/same_checkpoints.json`:

- **bit-identical** on the machine kind that wrote the goldens (same torch, CPU model, kernel capability and AMX:
  `_fingerprint`);
- **within a measured tolerance** on any other: another CPU takes other kernels (another SIMD width, another
  summation order), and AdamW's first steps turn that rounding into small moves of the weights. Each tensor's
  16-direction sketch (`trainer_runs.sketch`, less the key-projection biases that only float noise moves) must lie
  within `FACTOR` times the largest distance measured for that tensor between kernel kinds (or its trainer's
  median, where it came out the same on every kind), recorded with its machine and command in
  `data/same_checkpoints-spread.json` (`python experiments/goldens_spread.py --write`: the native AVX-512 kernels
  against AVX2 and SSE4.2 ones; the largest per trainer: FoCo 1.4e-5, foco-edits 2.7e-5 (both written again at
  issue 54, whose parameter groups change FoCo's weights by design), Pic2Word 3.1e-5, PACT 8.6e-6, TSCIR 9.7e-4,
  LinCIR 2.7e-6, the world backbone 1.9e-2, in the rarely used rows of its text position table).

The tests at the end show the tolerance catching a change of one trainer's update: FoCo with every learning rate
times 1.01 (67 of its 79 tensors fail, the farthest at 3,000 times its tolerance), and with one line of its loss
changed (the sigmoid's logits times 1.01: 54 fail, the farthest at 440 times). Measured once, not in the suite: the
world backbone's learning rate times 1.01 fails 14 of its 94 tensors (the farthest at 3.2 times).

`FOCO_WRITE_GOLDENS=1 pytest tests/test_same_checkpoints.py` writes the goldens anew on this machine kind, and
`python experiments/goldens_spread.py --write` the spread; do that only when a change is meant to change the
numbers, and say so in the commit.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
from pathlib import Path

import pytest
import torch

from trainer_runs import RUNS, digest_all, distance, run_every_trainer

DATA = Path(__file__).parent / "data"
GOLDENS = DATA / "same_checkpoints.json"
SPREAD = DATA / "same_checkpoints-spread.json"
FACTOR = 10  # a CPU we have not measured may round a few times worse than the kinds we measured


def _fingerprint() -> dict:
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"torch": torch.__version__, "machine": platform.machine(), "cpu": model,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "amx": "amx_bf16" in flags,  # oneDNN may take AMX tiles for some fp32 paths too
            # a generic model name ("AMD EPYC") covers several generations: MKL and oneDNN dispatch on the flags
            "flags": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]}


def tolerances() -> dict[str, dict[str, float]]:
    """{run: {tensor: FACTOR x the largest sketch distance measured for it between two kernel kinds}}; a tensor
    that happened to come out the same on every kind measured takes its trainer's median instead (another CPU may
    still round it otherwise)."""
    per_tensor = json.loads(SPREAD.read_text())["per_tensor"]
    out = {}
    for run, spreads in per_tensor.items():
        floor = max(1e-7, statistics.median(spreads.values()))
        out[run] = {key: FACTOR * max(d, floor) for key, d in spreads.items()}
    return out


def mismatches(got: dict, want: dict, exact: bool) -> list[str]:
    """What of `got` (trainer_runs.digest_all) differs from the goldens' runs `want`: a missing or extra run or
    tensor, and a tensor not bit-identical (`exact`) or outside its trainer's tolerance (otherwise)."""
    tol, bad = tolerances(), []
    for name, tensors in got.items():
        if name not in want or sorted(tensors) != sorted(want[name]):
            bad.append(f"{name}: other tensors than the goldens'")
            continue
        for key, g in tensors.items():
            w = want[name][key]
            if exact:
                if g["sha256"] != w["sha256"]:
                    bad.append(f"{name}: {key} is not bit-identical to the goldens")
            elif (d := distance(g["sketch"], w["sketch"])) > tol[name][key]:
                bad.append(f"{name}: {key} moved {d:.2e} (tolerance {tol[name][key]:.1e})")
    return bad


def _goldens() -> dict:
    return json.loads(GOLDENS.read_text())


@pytest.mark.slow
def test_every_trainer_saves_the_weights_it_saved_before(trainer_runs):
    """... and makes every tensor of its epochs with its device (`--device cpu`, test_devices.FactoryRecorder): the
    one run of every trainer serves both checks."""
    found = json.loads((trainer_runs / "found.json").read_text())
    assert found == [], "tensors made without their device:\n" + "\n".join(found)
    got = digest_all(trainer_runs)
    if os.environ.get("FOCO_WRITE_GOLDENS"):
        GOLDENS.write_text(json.dumps({"fingerprint": _fingerprint(), "runs": got}, indent=1) + "\n")
        pytest.skip(f"wrote {GOLDENS}")
    goldens = _goldens()
    exact = goldens["fingerprint"] == _fingerprint()
    assert sorted(got) == sorted(goldens["runs"])
    bad = mismatches(got, goldens["runs"], exact)
    assert not bad, "\n".join(bad)
    print("bit-identical check" if exact else f"tolerance check (goldens made on {goldens['fingerprint']})")


def test_the_tolerance_comes_from_a_measurement_between_kernel_kinds():
    spread = json.loads(SPREAD.read_text())
    assert spread["command"].startswith("python experiments/goldens_spread.py") and spread["machine"]
    assert len(spread["kinds"]) >= 2 and set(spread["spread"]) <= set(spread["kinds"])
    for kind in spread["spread"].values():
        assert set(kind) == set(RUNS)
    goldens = _goldens()["runs"]
    tol = tolerances()
    assert set(tol) == set(RUNS) and all(set(tol[run]) == set(goldens[run]) for run in RUNS)
    assert all(0 < t <= 0.5 for run in tol.values() for t in run.values())
    assert max(tol["foco"].values()) < 1e-3
    assert all(statistics.median(run.values()) < 1e-2 for run in tol.values())  # one noisy tensor loosens only itself


@pytest.fixture(scope="module")
def foco_golden():
    return {"foco": _goldens()["runs"]["foco"]}


def _foco_mutant(tiny_world, train_features, out: Path) -> tuple[list[str], float]:
    """FoCo's run changed: what the tolerance check says of it, and its largest move in tolerances."""
    run_every_trainer(tiny_world, train_features, out, only=("foco",))  # no edit store, no small world: FoCo reads
    # neither
    got, want = digest_all(out, ["foco"]), _goldens()["runs"]
    tol = tolerances()["foco"]
    worst = max(distance(g["sketch"], want["foco"][k]["sketch"]) / tol[k] for k, g in got["foco"].items())
    return mismatches(got, want, exact=False), worst


@pytest.mark.slow
def test_the_tolerance_fails_a_trainer_whose_learning_rate_is_1_01_times(tiny_world, train_features, foco_golden,
                                                                         tmp_path, monkeypatch):
    import foco.train.foco as trainer
    make = trainer._optimizer

    def faster(*args, **kwargs):  # each stage's optimiser, every group's learning rate times 1.01
        opt = make(*args, **kwargs)
        for group in opt.param_groups:
            group["lr"] *= 1.01
        return opt
    monkeypatch.setattr(trainer, "_optimizer", faster)
    bad, worst = _foco_mutant(tiny_world, train_features, tmp_path)
    # measured: 67 of FoCo's 79 tensors past their tolerance, the farthest 3,000 times it
    assert len(bad) >= 20 and worst > 50, (worst, bad)


@pytest.mark.slow
def test_the_tolerance_fails_a_trainer_with_one_line_of_its_loss_changed(tiny_world, train_features, foco_golden,
                                                                          tmp_path, monkeypatch):
    import torch.nn.functional as F
    import foco.train.losses as losses
    monkeypatch.setattr(losses, "_phi", lambda logits, sign: F.logsigmoid(sign * logits * 1.01))
    bad, worst = _foco_mutant(tiny_world, train_features, tmp_path)
    # measured: 54 of 79 tensors past their tolerance, the farthest 440 times it
    assert len(bad) >= 20 and worst > 50, (worst, bad)


def test_the_unchanged_run_passes_its_own_check(foco_golden):
    """The same digests pass both checks: the mismatch list is empty when nothing moved."""
    assert mismatches(foco_golden, foco_golden, exact=True) == []
    assert mismatches(foco_golden, foco_golden, exact=False) == []
