"""Every trainer's tiny run from the command line, made once per test run and shared (conftest's `trainer_runs`).

The goldens test (tests/test_same_checkpoints.py) hashes what these runs save, and tests that need a trained
checkpoint of one of these trainers read it here instead of training their own. `experiments/goldens_spread.py`
makes the same runs in a fresh process under other kernel kinds to measure how far another CPU moves them.

Everything here is fp32: the features (`build_train_features`) and the trainers (their default precision), so that
another CPU's rounding moves a weight by about 1e-6 of its size instead of the bf16 rounding's 1e-2.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

# The smallest world the commands run end to end on: 192 training pairs (the tiny world's 600 with a third of its
# test and val splits), for runs and tests whose point is the path, not the amount of data (conftest's small_world).
SMALL_WORLD = {"pretrain": 8, "train": 192, "backbone_val": 8, "val_single": 16, "val_multi": 8, "test_single": 8,
               "test_multi": 4}

# The runs, in the order they run. {f} the training features, {w} the world, {m} the small world, {o} the output
# root, {s} the features' backbone spec, {e} the rule-written edit store.
RUNS: dict[str, list[str]] = {
    "foco": ["train", "--features", "{f}", "--world", "{w}", "--stage1-epochs", "1", "--stage2-epochs", "1",
             "--batch-size", "128", "--max-negatives", "7", "--seed", "3"],
    "foco-edits": ["train", "--features", "{f}", "--world", "{w}", "--stage1-epochs", "1", "--stage2-epochs", "0",
                   "--batch-size", "128", "--edits", "{e}", "--stage3-epochs", "1", "--image-weight", "0.3",
                   "--edit-features", "{o}/edit-texts"],
    "pic2word": ["pic2word", "train", "--features", "{f}", "--epochs", "1", "--batch-size", "256"],
    "pact": ["pact", "train", "--features", "{f}", "--edits", "{e}", "--max-steps", "2", "--batch-size", "32",
             "--edit-features", "{o}/edit-texts"],
    "tscir": ["tscir", "train", "--features", "{f}", "--edits", "{e}", "--max-steps", "2", "--batch-size", "16",
              "--edit-features", "{o}/edit-texts"],
    # the world's 600 training captions on the features' backbone: tests/test_lincir.py evaluates this run
    "lincir": ["lincir", "train", "--world", "{w}", "--backbone", "{s}", "--epochs", "1", "--batch-size", "64"],
    # the +AD control (the decompositions rejoined join the captions) on the small world's 192: tests/test_lincir.py
    "lincir-ad": ["lincir", "train", "--world", "{m}", "--backbone", "{s}", "--epochs", "1", "--batch-size", "64",
                  "--add-decompositions", "--seed", "1"],
    "backbone": ["backbone", "train", "--world", "{w}", "--epochs", "1", "--batch-size", "256"],
}
WEIGHTS = ("foco.safetensors", "pic2word.safetensors", "mapper.safetensors", "text.safetensors",
           "lincir.safetensors", "model.safetensors")


def build_train_features(world: Path, root: Path) -> Path:
    """The tiny world's training split encoded in fp32 by a small random world backbone (seed 0) saved in
    `root`/bb; returns the feature folder `root`/f."""
    from foco import create_backbone
    from foco.backbones.world import WorldCLIP, save_world_checkpoint
    from foco.features import ExtractConfig
    from foco.world.splits import extract_world_split
    from test_train import SMALL
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(SMALL), root / "bb")
    extract_world_split(create_backbone(f"world:{root / 'bb'}"), world, "train", root / "f",
                        ExtractConfig(precision="fp32"), include_captions=False)
    return root / "f"


def generate_small_world(out: Path) -> Path:
    """The 192-pair world (`SMALL_WORLD`) in `out`."""
    from foco.world.generate import generate_world, world_config
    generate_world(out, world_config("tiny", **SMALL_WORLD))
    return out


def run_every_trainer(world: Path, features: Path, out: Path, small_world: Path | None = None,
                      only: tuple[str, ...] | None = None) -> list[str]:
    """Runs `RUNS` (or those named in `only`) into `out`/<name> with `--device cpu`, on one thread (the reduction
    order does not depend on the machine's cores), every training epoch under the FactoryRecorder. Returns what
    the recorder found: tensors made by foco's code without their device."""
    import foco.train.loop as loop
    from foco.cli import main
    from foco.decompose.inputs import read_captions
    from foco.edits.rule import RuleWriter
    from foco.edits.run import GenerateConfig, run_generate
    from foco.features import FeatureCache
    from test_devices import FactoryRecorder
    chosen = {name: argv for name, argv in RUNS.items() if only is None or name in only}
    store = out / "e.sqlite"
    if any("{e}" in argv for argv in chosen.values()):
        run_generate([(r.id, r.truth) for r in read_captions(world, split="train")][:200], RuleWriter(), store,
                     GenerateConfig(per_caption=1))
    fill = {"f": str(features), "w": str(world), "m": str(small_world), "o": str(out), "e": str(store),
            "s": FeatureCache(features).manifest["backbone"]}
    rec, epoch, threads = FactoryRecorder(), loop._epoch, torch.get_num_threads()

    def recorded(*args, **kwargs):
        with rec:
            return epoch(*args, **kwargs)
    loop._epoch = recorded
    torch.set_num_threads(1)
    try:
        for name, argv in chosen.items():
            argv = [a.format(**fill) for a in argv] + ["--out", str(out / name), "--device", "cpu"]
            assert main(argv) == 0, argv
    finally:
        loop._epoch = epoch
        torch.set_num_threads(threads)
    return sorted(set(rec.found))


def digest(folder: Path) -> dict:
    """{file/tensor: {"sha256", "sketch"}} of every weights file a run saved (not its resumable state). The sketch
    is the tensor's projection on 16 fixed random directions (`sketch`): how far two runs' tensors are apart,
    ||sketch(a) - sketch(b)|| / ||sketch(b)||, is within a factor of about 2 of ||a - b|| / ||b||."""
    from safetensors.torch import load_file
    import hashlib
    got = {}
    for name in WEIGHTS:
        path = folder / name
        if not path.exists():
            continue
        for key, t in sorted(load_file(path).items()):
            got[f"{name}/{key}"] = {
                "sha256": hashlib.sha256(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest(),
                "sketch": sketch(comparable(key, t))}
    assert got, f"{folder} saved no weights"
    return got


SKETCH = 16


def comparable(key: str, t: torch.Tensor) -> torch.Tensor:
    """What of a tensor another CPU must reproduce: all of it, less the key-projection biases, whose exact gradient
    is zero (softmax is blind to a shift every key shares), so that AdamW moves them by float noise alone
    (measured: 0.85-1.6 relative between kernel kinds, against 1e-6 for the query and value biases beside them).
    nn.MultiheadAttention packs them as the middle third of `in_proj_bias`; a separate `k_proj.bias` is left out
    whole (an empty tensor: its sketch is zeros). The sha256 still covers every element."""
    flat = t.detach().reshape(-1)
    if key.endswith("k_proj.bias"):
        return flat[:0]
    if key.endswith("in_proj_bias"):
        e = flat.numel() // 3
        return torch.cat([flat[:e], flat[2 * e:]])
    return flat


def sketch(t: torch.Tensor) -> list[float]:
    """(SKETCH,) the flattened tensor (float64) times a fixed Gaussian matrix (SKETCH, n) / sqrt(SKETCH)."""
    flat = t.detach().reshape(-1).to(torch.float64)
    g = torch.Generator().manual_seed(flat.numel())
    proj = torch.randn(SKETCH, flat.numel(), generator=g, dtype=torch.float64) / SKETCH ** 0.5  # (S, n)
    return [float(v) for v in proj @ flat]


def distance(got: list[float], want: list[float]) -> float:
    """The relative distance of two sketches: ||got - want|| / ||want|| (a zero tensor: the absolute distance)."""
    a, b = torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64)
    scale = float(b.norm())
    return float((a - b).norm()) / (scale if scale > 0 else 1.0)


def digest_all(out: Path, names=None) -> dict:
    return {name: digest(out / name) for name in (names or RUNS)}


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")
