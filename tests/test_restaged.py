"""The `restaged` world protocol (issue 40): described's queries over a gallery in which every picture is redrawn
with its nuisance resampled; semantics kept, draws nested in the strength, records checked, and the paths a user
takes: world verify, features extract, eval --protocols restaged, export --format cirr."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from foco.cli import main
from foco.utils.io import read_jsonl
from foco.world.manifest import load_benchmark
from foco.world.render import Look, render_scene
from foco.world.restaged import _image_rng, restage
from foco.world.scene import Scene, sample_scene


@pytest.fixture
def world(small_world, tmp_path):
    """A copy of the 192-pair world: `world restage` writes into the world folder."""
    return shutil.copytree(small_world, tmp_path / "w")


def _gallery(world, split="val", protocol="restaged"):
    return read_jsonl(world / "benchmarks" / split / protocol / "gallery.jsonl")


def _pixels(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_the_default_look_is_the_worlds_own_drawing(tiny_world):
    for g in _gallery(tiny_world, protocol="single")[:30]:
        scene = Scene.from_dict(g["scene"])
        assert (np.asarray(render_scene(scene, look=Look())) == _pixels(tiny_world / g["image"])).all()


def test_restaging_keeps_what_a_text_can_say_and_grows_with_the_strength():
    rng = np.random.default_rng(0)
    scenes = [sample_scene(rng) for _ in range(200)]
    moved = {}
    for s in (0.0, 0.5, 1.0):
        moved[s] = set()
        for k, scene in enumerate(scenes):
            new, look = restage(scene, s, _image_rng(0, "val", f"g{k}"))
            assert new.semantic_key() == scene.semantic_key()  # kinds, colours, size classes, background
            if s == 0.0:
                assert new == scene and look == Look()
            moved[s] |= {(k, i) for i, (a, b) in enumerate(zip(scene.objects, new.objects)) if a.cell != b.cell}
            assert len({o.cell for o in new.objects}) == len(new.objects)  # one object per cell
            if s == 1.0:
                img = np.asarray(render_scene(new, look=look), float)
                assert img.shape == (64, 64, 3)
    assert moved[0.0] == set() and 0 < len(moved[0.5]) < len(moved[1.0])
    assert 0.35 < len(moved[1.0]) / sum(len(s.objects) for s in scenes) < 0.95
    with pytest.raises(ValueError, match="--strength"):
        restage(scenes[0], 1.5, np.random.default_rng(0))


def test_strength_zero_redraws_single_and_reads_described_text(world, capsys):
    assert main(["world", "describe", "--world", str(world), "--share", "0.6"]) == 0
    assert main(["world", "restage", "--world", str(world), "--strength", "0", "--share", "0.6"]) == 0
    assert "extract its features with `foco features extract --split val/restaged`" in capsys.readouterr().out
    for split in ("val", "test"):
        single, restaged = _gallery(world, split, "single"), _gallery(world, split)
        assert [g["id"] for g in restaged] == [g["id"] for g in single]
        for s, r in zip(single, restaged):
            assert r["source"] == s["image"] and r["image"] != s["image"]
            assert (_pixels(world / r["image"]) == _pixels(world / s["image"])).all()
        described = read_jsonl(world / "benchmarks" / split / "described" / "queries.jsonl")
        assert read_jsonl(world / "benchmarks" / split / "restaged" / "queries.jsonl") == described


def test_records_are_checked_and_verify_hashes_the_pictures(world, capsys):
    assert main(["world", "restage", "--world", str(world), "--strength", "0.7", "--share", "0.8"]) == 0
    b = load_benchmark(world, "val", "restaged")
    gallery = _gallery(world)
    assert [str(p.relative_to(world)) for p in b.gallery_images] == [g["image"] for g in gallery]
    moved = sum(a["cell"] != s["cell"] for g, s in zip(gallery, _gallery(world, protocol="single"))
                for a, s in zip(g["scene"]["objects"], s["scene"]["objects"]))
    assert moved > 0
    # a target is another picture: further from its reference, pixel for pixel, than single's redrawn one
    queries = read_jsonl(world / "benchmarks" / "val" / "single" / "queries.jsonl")
    paths = {p: {g["id"]: world / g["image"] for g in _gallery(world, protocol=p)} for p in ("single", "restaged")}
    gap = {p: np.mean([np.abs(_pixels(paths[p][q["reference"]]).astype(float)
                              - _pixels(paths[p][q["target"]])).mean() for q in queries]) for p in paths}
    assert gap["restaged"] > 1.5 * gap["single"]
    capsys.readouterr()
    assert main(["world", "verify", str(world)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["val/restaged"]["gallery"] == len(gallery)
    # another strength without --force: refused, nothing written
    before = (world / "benchmarks" / "val" / "restaged" / "restaged.json").read_bytes()
    assert main(["world", "restage", "--world", str(world), "--strength", "0.3", "--share", "0.8"]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (world / "benchmarks" / "val" / "restaged" / "restaged.json").read_bytes() == before
    # a replaced picture: verify names it and the record it breaks
    pic = world / gallery[0]["image"]
    Image.new("RGB", (64, 64), "red").save(pic)
    assert main(["world", "verify", str(world)]) == 2
    err = capsys.readouterr().err
    assert gallery[0]["id"] in err and "restaged.json" in err
    # an edited manifest: every reader refuses it
    path = world / "benchmarks" / "val" / "restaged" / "queries.jsonl"
    path.write_text(path.read_text().replace("make", "mkae", 1))
    with pytest.raises(ValueError, match="edited since"):
        load_benchmark(world, "val", "restaged")
    shutil.rmtree(world / "benchmarks" / "test" / "restaged")
    with pytest.raises(FileNotFoundError, match="foco world restage"):
        load_benchmark(world, "test", "restaged")


@pytest.mark.slow
def test_eval_reads_it_and_refuses_features_of_another_restaging(world, tmp_path, capsys):
    assert main(["world", "restage", "--world", str(world), "--strength", "1", "--share", "1"]) == 0
    assert main(["world", "describe", "--world", str(world), "--share", "1"]) == 0
    feats = tmp_path / "f"
    for split in ("val", "test"):
        for protocol in ("restaged", "described"):
            assert main(["features", "extract", "--backbone", "world:pretrained", "--world", str(world), "--split",
                         f"{split}/{protocol}", "--out", str(feats / f"{split}-{protocol}")]) == 0
    base = ["eval", "--world", str(world), "--features", str(feats), "--methods", "text,image,sum,slerp"]
    assert main(base + ["--protocols", "described,restaged", "--out", str(tmp_path / "r.json")]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert "slerp alpha (restaged)" in r["chosen"]
    part = r["parts"]["world/restaged"]
    assert part["restaged_strength"] == 1.0 and part["described_share"] == 1.0
    described = r["parts"]["world/described"]["methods"]
    assert part["queries"] == r["parts"]["world/described"]["queries"]
    assert part["methods"]["text"] != described["text"]  # the same texts, other pictures
    # the CIRR export of the restaged protocol gives the same numbers through the official reader
    assert main(["world", "export", "--world", str(world), "--format", "cirr", "--split", "val", "--protocol",
                 "restaged", "--out", str(tmp_path / "cirr")]) == 0
    assert main(["eval", "--benchmark", "cirr", "--root", str(tmp_path / "cirr"), "--split", "val", "--backbone",
                 "world:pretrained", "--methods", "image,sum", "--cache", str(tmp_path / "cache"),
                 "--out", str(tmp_path / "c.json")]) == 0
    official = json.loads((tmp_path / "c.json").read_text())["parts"]["cirr"]["methods"]
    assert main(["eval", "--world", str(world), "--features", str(feats), "--split", "val", "--protocols",
                 "restaged", "--methods", "image,sum", "--out", str(tmp_path / "v.json")]) == 0
    direct = json.loads((tmp_path / "v.json").read_text())["methods"]
    for name in ("image", "sum"):
        for k, v in official[name].items():
            assert abs(v - direct[name][k]) < 1e-6, (name, k, v, direct[name][k])
    # restaged again at another strength (same ids, same texts): the old features are refused, not used
    assert main(["world", "restage", "--world", str(world), "--strength", "0.5", "--share", "1", "--force"]) == 0
    capsys.readouterr()
    assert main(["eval", "--world", str(world), "--features", str(feats), "--split", "val", "--protocols",
                 "restaged", "--methods", "image", "--out", str(tmp_path / "stale.json")]) == 2
    assert "was written again since these features were extracted" in capsys.readouterr().err
    # a cache that records no restaging, and the described protocol's cache in the restaged one's place: refused
    for name, source, words in (("bare", "val/restaged", "records no fingerprint of the restaged pictures"),
                                ("swapped", "val/described", "holds the features of val/described")):
        shutil.copytree(feats / "val-restaged", tmp_path / name / "val-restaged")
        manifest = tmp_path / name / "val-restaged" / "manifest.json"
        m = json.loads(manifest.read_text())
        m["source"] = {"world": m["source"]["world"], "split": source}
        manifest.write_text(json.dumps(m))
        assert main(["eval", "--world", str(world), "--features", str(tmp_path / name), "--split", "val",
                     "--protocols", "restaged", "--methods", "image", "--out", str(tmp_path / "no.json")]) == 2
        assert words in capsys.readouterr().err
    # val and test at other strengths: slerp's alpha is not chosen across them
    assert main(["world", "restage", "--world", str(world), "--strength", "0.2", "--share", "1", "--split", "test",
                 "--force"]) == 0
    assert main(["features", "extract", "--backbone", "world:pretrained", "--world", str(world), "--split",
                 "test/restaged", "--out", str(tmp_path / "f2" / "test-restaged")]) == 0
    assert main(["features", "extract", "--backbone", "world:pretrained", "--world", str(world), "--split",
                 "val/restaged", "--out", str(tmp_path / "f2" / "val-restaged")]) == 0
    capsys.readouterr()
    assert main(["eval", "--world", str(world), "--features", str(tmp_path / "f2"), "--protocols", "restaged",
                 "--methods", "slerp", "--out", str(tmp_path / "x.json")]) == 2
    assert "restaged strength" in capsys.readouterr().err
