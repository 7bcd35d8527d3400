"""The scripts behind issue 3's analysis: the supervised ceiling (edit triplets from scenes no split uses) and the
text-reliance diagnostic. Small: one mini world and a random small world backbone."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from foco.benchmarks.world import load_world_part
from foco.methods import build_method
from foco.features import ExtractConfig
from foco.world.edits import apply_edit
from foco.world.scene import Scene
from foco.world.splits import extract_world_split

from test_field import mini_world, world_bb  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def features(mini_world, world_bb, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("ceiling")
    for split in ("val", "test"):
        for proto in ("single", "multi"):
            extract_world_split(world_bb, mini_world, f"{split}/{proto}", root / f"{split}-{proto}",
                                ExtractConfig(dtype="float32"))
    world_bb.save(root / "backbone")
    return root


def test_triplets_use_fresh_scenes_and_the_benchmark_edits(mini_world):  # noqa: F811
    ceiling = _script("supervised_ceiling")
    taken = ceiling.world_layouts(mini_world)
    assert len(taken) > 200  # pairs and galleries of every split
    triplets = ceiling.make_triplets(300, taken, seed=5)
    assert len(triplets) == 300
    for ref, text, target in triplets:
        assert ref.layout_key() not in taken and target.layout_key() not in taken
        assert target.semantic_key() != ref.semantic_key() and text
    # the same seed gives the same triplets
    again = ceiling.make_triplets(300, taken, seed=5)
    assert [(r.to_dict(), t) for r, t, _ in again] == [(r.to_dict(), t) for r, t, _ in triplets]
    # the first triplet is the first fresh scene, edited by the benchmark's own sampler with the same generator
    from foco.world.edits import PHRASINGS, applicable_types, edit_text, sample_edit
    from foco.world.scene import sample_scene
    rng = np.random.default_rng(5)
    ref = sample_scene(rng)
    while ref.layout_key() in taken:
        ref = sample_scene(rng)
    edit = sample_edit(rng, ref, str(rng.choice(applicable_types(ref))))
    assert triplets[0][0] == ref and apply_edit(ref, edit) == triplets[0][2]
    assert triplets[0][1] == edit_text(ref, edit, int(rng.integers(len(PHRASINGS[edit.type]))))
    assert isinstance(triplets[0][0], Scene)


def test_text_reliance_of_image_only_and_sum(mini_world, features):  # noqa: F811
    reliance = _script("foco_text_reliance").reliance
    bench, feats = load_world_part(mini_world, "val", "single", features / "val-single")
    image = reliance(build_method("image", None), bench, feats)
    assert image["cos(query, query with another text)"] == pytest.approx(1.0, abs=1e-5)
    assert image["cos(query, reference)"] == pytest.approx(1.0, abs=1e-5)
    assert image["cos(query, target)"] == pytest.approx(image["cos(reference, target)"], abs=1e-5)
    text_sum = reliance(build_method("sum", None), bench, feats)
    assert text_sum["cos(query, query with another text)"] < 0.999
    assert text_sum["cos(query, reference)"] < 0.999


def test_supervised_ceiling_end_to_end(mini_world, features, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "ceiling"
    argv = ["supervised_ceiling.py", "--world", str(mini_world), "--backbone", f"world:{features / 'backbone'}",
            "--features", str(features), "--out", str(out), "--n", "96", "--epochs", "2", "--batch", "32"]
    monkeypatch.setattr(sys, "argv", argv)
    torch.manual_seed(0)
    _script("supervised_ceiling").main()
    res = json.loads((out / "results.json").read_text())
    assert res["triplets"] == 96
    for split in ("val", "test"):
        rows = res[split]
        assert set(rows) == {"image", "text", "sum", "supervised ceiling", "target caption (oracle)"}
        for row in rows.values():
            assert 0.0 <= row["R@1"] <= 100.0 and 0.0 <= row["mAP@10"] <= 100.0
            assert set(row["R@1_by_edit_type"]) <= {"add", "background", "colour", "remove", "replace", "size"}
    assert (out / "foco.safetensors").is_file() and (out / "triplets-96-123.safetensors").is_file()
    # the saved ceiling loads as a FoCo-architecture checkpoint
    assert build_method("foco", str(out)) is not None
