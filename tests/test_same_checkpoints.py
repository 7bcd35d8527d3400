"""Issue 41: moving the trainers onto one harness (and the training data onto one protocol) changes no number.

Every trainer runs a tiny job from the command line, as a user would: FoCo's two stages, foco-edits' edit stage
(with the target-image term), Pic2Word, PACT, TSCIR, LinCIR (+AD) and the world backbone. The weights each one saves
are hashed tensor by tensor and held against `data/same_checkpoints*.json`, each written by the code before the move
(6f96e77) on one machine kind (`FOCO_WRITE_GOLDENS=1 pytest tests/test_same_checkpoints.py` writes this machine
kind's file anew; do that only when a change is meant to change the numbers, and say so in the commit).

Bit-identical is what the test asks on a machine kind that has goldens (the same torch, CPU model, kernel
capability, native bf16 and AMX, one thread): `same_checkpoints.json` was made on a Xeon with AMX (the pre-harness
code gives other bits on the same model name without AMX, every other field equal), `same_checkpoints-noamx.json`
on one without. Elsewhere the CPU's kernels round differently (another SIMD width, and the shared features fixture
in fp32 where bf16 is not native), so there the test checks every tensor's probe (its sum, absolute sum and first
values) to 1 % of the first goldens instead, which a changed seed or order still fails by far, and says which
check ran.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import pytest
import torch

from foco.cli import main
from test_devices import recorder  # noqa: F401  (fixture: every training epoch under the FactoryRecorder)

GOLDENS = Path(__file__).parent / "data" / "same_checkpoints.json"  # the first machine kind's; others beside it
PROBE_REL = 1e-2  # a changed seed, initialisation order or data order moves a probe by far more than this
WEIGHTS = ("foco.safetensors", "pic2word.safetensors", "mapper.safetensors", "text.safetensors",
           "lincir.safetensors", "model.safetensors")


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
    from foco.utils.precision import native_bf16
    return {"torch": torch.__version__, "machine": platform.machine(), "cpu": model,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": native_bf16("cpu"),  # the shared features fixture is bf16 only where it is native
            "amx": "amx_bf16" in flags}  # oneDNN's bf16 matmuls round otherwise with AMX tiles


def _digest(folder: Path) -> dict:
    """{file/tensor: {"sha256", "probe"}} of every weights file a run saved (not its resumable state)."""
    from safetensors.torch import load_file
    out = {}
    for name in WEIGHTS:
        path = folder / name
        if not path.exists():
            continue
        for key, t in sorted(load_file(path).items()):
            flat = t.detach().reshape(-1).to(torch.float64)
            out[f"{name}/{key}"] = {
                "sha256": hashlib.sha256(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest(),
                "probe": [float(flat.sum()), float(flat.abs().sum()), *map(float, flat[:4])]}
    assert out, f"{folder} saved no weights"
    return out


@pytest.mark.slow
def test_every_trainer_saves_the_weights_it_saved_before_the_harness(recorder, tiny_world,  # noqa: F811
                                                                     train_features, tmp_path):
    """... and makes every tensor of its epochs with its device (`--device cpu`, test_devices.FactoryRecorder): the
    one run of every trainer serves both checks."""
    from foco.decompose.inputs import read_captions
    from foco.edits.rule import RuleWriter
    from foco.edits.run import GenerateConfig, run_generate
    from foco.features import FeatureCache
    torch.set_num_threads(1)  # one thread: the reduction order does not depend on the machine's cores
    store = tmp_path / "e.sqlite"
    run_generate([(r.id, r.truth) for r in read_captions(tiny_world, split="train")][:200], RuleWriter(), store,
                 GenerateConfig(per_caption=1))
    f, w, o = str(train_features), str(tiny_world), tmp_path
    spec = FeatureCache(train_features).manifest["backbone"]
    texts = ["--edit-features", str(o / "edit-texts")]
    runs = {"foco": ["train", "--features", f, "--world", w, "--stage1-epochs", "1", "--stage2-epochs", "1",
                     "--batch-size", "128", "--max-negatives", "7", "--seed", "3"],
            "foco-edits": ["train", "--features", f, "--world", w, "--stage1-epochs", "1", "--stage2-epochs", "0",
                           "--batch-size", "128", "--edits", str(store), "--stage3-epochs", "1", "--image-weight",
                           "0.3", *texts],
            "pic2word": ["pic2word", "train", "--features", f, "--epochs", "1", "--batch-size", "256"],
            "pact": ["pact", "train", "--features", f, "--edits", str(store), "--max-steps", "2", "--batch-size",
                     "32", *texts],
            "tscir": ["tscir", "train", "--features", f, "--edits", str(store), "--max-steps", "2", "--batch-size",
                      "16", *texts],
            "lincir-ad": ["lincir", "train", "--world", w, "--backbone", spec, "--epochs", "1", "--batch-size", "64",
                          "--add-decompositions", "--seed", "1"],
            "backbone": ["backbone", "train", "--world", w, "--epochs", "1", "--batch-size", "256"]}
    got = {}
    for name, argv in runs.items():
        assert main(argv + ["--out", str(o / name), "--device", "cpu"]) == 0, argv
        got[name] = _digest(o / name)
    assert recorder.found == [], "tensors made without their device:\n" + "\n".join(sorted(set(recorder.found)))
    kinds = {path: json.loads(path.read_text()) for path in sorted(GOLDENS.parent.glob("same_checkpoints*.json"))}
    mine = [path for path, g in kinds.items() if g["fingerprint"] == _fingerprint()]
    if os.environ.get("FOCO_WRITE_GOLDENS"):
        path = mine[0] if mine else GOLDENS.with_name(f"same_checkpoints-{len(kinds)}.json")
        path.write_text(json.dumps({"fingerprint": _fingerprint(), "runs": got}, indent=1) + "\n")
        pytest.skip(f"wrote {path}")
    exact = bool(mine)
    want = kinds[mine[0] if mine else GOLDENS]
    assert sorted(got) == sorted(want["runs"])
    for name in runs:
        assert sorted(got[name]) == sorted(want["runs"][name]), name
        for key, g in got[name].items():
            w_ = want["runs"][name][key]
            if exact:
                assert g["sha256"] == w_["sha256"], f"{name}: {key} is not bit-identical to the goldens"
            else:  # another CPU: other rounding, and fp32 features where bf16 is not native
                assert g["probe"] == pytest.approx(w_["probe"], rel=PROBE_REL, abs=1e-4), f"{name}: {key} moved"
    print("bit-identical check" if exact else f"probe check (goldens made on {want['fingerprint']})")
