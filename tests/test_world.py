"""The embedded world: determinism, captions, decompositions, edits, galleries, splits and errors."""
import json
import shutil
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from foco.utils.io import ImageLoadError, ManifestError, load_image, read_jsonl
from foco.world import Scene, generate_world, load_benchmark, load_pairs, world_config
from foco.world.captions import TEMPLATES
from foco.world.edits import PHRASINGS
from foco.world.verify import verify_world
from foco.world.vocab import COLOURS, SHAPES, SIZES

SMALL = dict(pretrain=60, train=40, backbone_val=30, val_single=8, val_multi=6, test_single=10, test_multi=6)


def _manifest_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in (".json", ".jsonl")}


def test_vocabulary_is_large_enough():
    assert len(SHAPES) >= 8 and len(COLOURS) >= 10 and len(SIZES) == 2
    assert all(len(p) >= 4 for p in PHRASINGS.values()) and len(PHRASINGS) == 6
    assert len(TEMPLATES) >= 5


def test_same_seed_gives_byte_identical_world(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate_world(a, world_config("tiny", seed=3, **SMALL), workers=1)
    generate_world(b, world_config("tiny", seed=3, **SMALL), workers=2)
    generate_world(c, world_config("tiny", seed=4, **SMALL), workers=1)
    ma, mb = _manifest_bytes(a), _manifest_bytes(b)
    assert ma.keys() == mb.keys() and len(ma) == 12
    assert ma == mb
    pngs = sorted(p.relative_to(a) for p in a.rglob("*.png"))
    assert pngs and all((a / p).read_bytes() == (b / p).read_bytes() for p in pngs)
    assert _manifest_bytes(c)["pairs/pretrain.jsonl"] != ma["pairs/pretrain.jsonl"]


def test_captions_vary_and_decompose_per_component(tiny_world):
    pairs = read_jsonl(tiny_world / "pairs" / "pretrain.jsonl")
    openings = Counter(" ".join(r["caption"].split()[:2]) for r in pairs)
    assert len(openings) >= 5
    orders, partial, no_bg = set(), 0, 0
    for r in pairs:
        scene = Scene.from_dict(r["scene"])
        dec = r["decomposition"]
        grounds = r["grounding"]
        assert len(dec["pairs"]) == len(grounds) and len(set(grounds)) == len(grounds)
        objs = [int(g.split(":")[1]) for g in grounds if g.startswith("object:")]
        assert objs and all(0 <= i < len(scene.objects) for i in objs)
        partial += len(objs) < len(scene.objects)
        no_bg += "background" not in grounds
        for pair, ground in zip(dec["pairs"], grounds):
            assert pair["local"] in r["caption"] or ground == "background"
            assert pair["local"] and pair["context"] and pair["context"] != r["caption"]
        if len(objs) >= 2:
            orders.add(tuple(objs))
        assert dec["decomposer"] == {"name": "oracle"}
    assert len(orders) > 3  # object order is varied
    assert 0.1 * len(pairs) < partial < 0.5 * len(pairs) and no_bg > 0  # some captions are partial, like alt-text
    for r in read_jsonl(tiny_world / "pairs" / "backbone_val.jsonl"):  # held-out captions name everything
        assert len(r["grounding"]) == len(r["scene"]["objects"]) + 1


def test_modification_texts_are_instructions_never_captions(tiny_world):
    captions = " || ".join(r["caption"].lower() for s in ("pretrain", "train", "backbone_val")
                           for r in read_jsonl(tiny_world / "pairs" / f"{s}.jsonl"))
    for split in ("val", "test"):
        for proto in ("single", "multi"):
            for q in read_jsonl(tiny_world / "benchmarks" / split / proto / "queries.jsonl"):
                assert q["modification"].lower() not in captions
    for verb in ("make ", "change ", "replace ", "remove ", "add ", "get rid", "instead of", "delete "):
        assert verb not in captions


def _scenes(root, split, proto):
    return {g["id"]: Scene.from_dict(g["scene"])
            for g in read_jsonl(root / "benchmarks" / split / proto / "gallery.jsonl")}


def test_single_target_edits_keep_the_other_objects(tiny_world):
    scenes = _scenes(tiny_world, "test", "single")
    queries = read_jsonl(tiny_world / "benchmarks" / "test" / "single" / "queries.jsonl")
    assert len(queries) >= 50
    types = Counter()
    for q in queries:
        ref, tgt, e = scenes[q["reference"]], scenes[q["target"]], q["edit"]
        types[e["type"]] += 1
        untouched_ref = [o for i, o in enumerate(ref.objects) if i != e["index"]]
        if e["type"] in ("colour", "size", "replace", "remove"):
            assert all(o in tgt.objects for o in untouched_ref)
            assert len(tgt.objects) == len(ref.objects) - (e["type"] == "remove")
        if e["type"] == "add":
            assert set(ref.objects) < set(tgt.objects) and len(tgt.objects) == len(ref.objects) + 1
        if e["type"] == "background":
            assert tgt.objects == ref.objects and tgt.background != ref.background
        # the subset: 6 distinct members, reference and target included, the rest hard negatives
        assert len(set(q["subset"])) == 6 and q["reference"] in q["subset"] and q["target"] in q["subset"]
        # the target is the only gallery image that satisfies the query
        twins = [g for g, s in scenes.items() if s.semantic_key() == tgt.semantic_key()]
        assert twins == [q["target"]]
    assert set(types) == {"colour", "size", "replace", "add", "remove", "background"}
    positions = Counter(q["subset"].index(q["target"]) for q in queries)
    assert len(positions) >= 4  # the target's place in the subset gives nothing away


def test_hard_negatives_include_right_edit_on_wrong_object(tiny_world):
    scenes = _scenes(tiny_world, "test", "single")
    found = 0
    for q in read_jsonl(tiny_world / "benchmarks" / "test" / "single" / "queries.jsonl"):
        if q["edit"]["type"] != "colour":
            continue
        ref = scenes[q["reference"]]
        for m in q["subset"]:
            s = scenes[m]
            changed = [i for i, (a, b) in enumerate(zip(ref.objects, s.objects)) if a != b]
            if len(s.objects) == len(ref.objects) and changed and changed != [q["edit"]["index"]] and \
                    s.objects[changed[0]].colour == q["edit"]["colour"]:
                found += 1
    assert found >= 1


def test_multi_target_ground_truth_is_every_semantic_twin(tiny_world):
    scenes = _scenes(tiny_world, "test", "multi")
    queries = read_jsonl(tiny_world / "benchmarks" / "test" / "multi" / "queries.jsonl")
    assert sum(len(q["targets"]) >= 2 for q in queries) >= len(queries) // 2
    for q in queries:
        key = scenes[q["targets"][0]].semantic_key()
        assert sorted(q["targets"]) == sorted(g for g, s in scenes.items() if s.semantic_key() == key)
        assert len({scenes[t].layout_key() for t in q["targets"]}) == len(q["targets"])


def test_splits_are_disjoint(tiny_world):
    layouts = {}
    for split in ("pretrain", "train", "backbone_val"):
        layouts[split] = {Scene.from_dict(r["scene"]).layout_key() for r in read_jsonl(tiny_world / "pairs" / f"{split}.jsonl")}
    for split in ("val", "test"):
        layouts[split] = set()
        for proto in ("single", "multi"):
            layouts[split] |= {s.layout_key() for s in _scenes(tiny_world, split, proto).values()}
    names = list(layouts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not layouts[a] & layouts[b], (a, b)
    pre = {Scene.from_dict(r["scene"]).semantic_key() for r in read_jsonl(tiny_world / "pairs" / "pretrain.jsonl")}
    held = [Scene.from_dict(r["scene"]).semantic_key() for r in read_jsonl(tiny_world / "pairs" / "backbone_val.jsonl")]
    assert not pre & set(held) and len(set(held)) == len(held)


def test_images_render_as_documented(tiny_world):
    pairs = load_pairs(tiny_world, "train")
    im = load_image(pairs[0].image)
    assert im.size == (64, 64) and im.mode == "RGB"
    assert np.asarray(im).std() > 5


def test_stamps_folder_adds_captioned_cutouts(tmp_path):
    stamps = tmp_path / "stamps" / "animals"
    stamps.mkdir(parents=True)
    for name, rgb in (("cat", (200, 120, 40)), ("dog", (90, 60, 30))):
        im = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
        im.paste(Image.new("RGBA", (20, 20), rgb + (255,)), (10, 5))
        im.save(stamps / f"{name}.png")
        (stamps / f"{name}.txt").write_text(f"A {name}.\nfr.utf8=Un {name}\n")
    Image.new("RGBA", (8, 8)).save(stamps / "uncaptioned.png")
    cfg = world_config("tiny", seed=1, stamps_dir=str(tmp_path / "stamps"), stamp_prob=0.5, **SMALL)
    generate_world(tmp_path / "w", cfg, workers=1)
    pairs = read_jsonl(tmp_path / "w" / "pairs" / "pretrain.jsonl")
    kinds = {o["kind"] for r in pairs for o in r["scene"]["objects"] if o["stamp"]}
    assert kinds == {"cat", "dog"}
    assert any(" cat" in r["caption"] or " dog" in r["caption"] for r in pairs)
    verify_world(tmp_path / "w")


def test_corrupt_or_missing_image_is_named(tmp_path, tiny_world):
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world)
    pairs = load_pairs(world, "train")
    pairs[0].image.write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    pairs[1].image.unlink()
    with pytest.raises(ImageLoadError, match=pairs[0].image.name):
        load_image(pairs[0].image)
    with pytest.raises(ImageLoadError, match=pairs[1].image.name):
        load_image(pairs[1].image)
    with pytest.raises(ImageLoadError) as err:
        verify_world(world)
    assert "2 of" in str(err.value) and pairs[0].image.name in str(err.value) and pairs[1].image.name in str(err.value)


def test_malformed_manifests_are_named(tmp_path, tiny_world):
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world)
    path = world / "pairs" / "train.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + ['{"id": "x", "image": '] + lines[3:]) + "\n")
    with pytest.raises(ManifestError, match=r"train\.jsonl:3: not valid JSON"):
        load_pairs(world, "train")
    rec = json.loads(lines[0]); del rec["caption"]
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ManifestError, match=r"train\.jsonl:1: missing field\(s\) caption"):
        load_pairs(world, "train")
    rec = json.loads(lines[0]); rec["decomposition"]["pairs"][0]["local"] = ""
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ManifestError, match="empty local caption"):
        load_pairs(world, "train")
    q = world / "benchmarks" / "val" / "single" / "queries.jsonl"
    rec = json.loads(q.read_text().splitlines()[0]); rec["target"] = "nope"
    q.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ManifestError, match=r"queries\.jsonl:1: 1 id\(s\) not in the gallery"):
        load_benchmark(world, "val", "single")
    (world / "pairs" / "pretrain.jsonl").unlink()
    with pytest.raises(ManifestError, match="manifest not found.*pretrain.jsonl"):
        load_pairs(world, "pretrain")


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    from foco.cli import main
    assert main(["world", "verify", str(tmp_path / "missing")]) == 2
    assert "world.json" in capsys.readouterr().err
