"""Instance marks and the OACIR protocol of the embedded world (`foco.world.oacir`)."""
import numpy as np
import pytest

from foco.cli import main
from foco.utils.io import ManifestError, read_jsonl
from foco.world import Scene, WorldObject, generate_world, load_benchmark, render_scene, world_config
from foco.world.oacir import instance_id, load_oacir, oacir_statistics
from foco.world.vocab import MARKS, SHAPES

SMALL = dict(pretrain=20, train=10, backbone_val=10, val_single=4, val_multi=2, test_single=6, test_multi=2)
N = 10  # queries per split


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("oacir") / "w"
    generate_world(root, world_config("tiny", seed=5, **SMALL), workers=1)
    assert main(["world", "oacir", "--world", str(root), "--queries", str(N)]) == 0
    return root


def _scenes(root, split):
    return {g["id"]: Scene.from_dict(g["scene"])
            for g in read_jsonl(root / "benchmarks" / split / "oacir" / "gallery.jsonl")}


def test_marks_render_apart_and_none_renders_as_before():
    for size in ("small", "large"):
        for kind in SHAPES:
            plain = WorldObject(kind, "red", size, 1, (2, -1))
            pictures = [np.asarray(render_scene(Scene("snow", (WorldObject(kind, "red", size, 1, (2, -1), mark=m),))),
                                   dtype=np.int16) for m in MARKS]
            for i in range(len(MARKS)):
                for j in range(i):
                    assert np.abs(pictures[i] - pictures[j]).sum() > 0, (kind, size, MARKS[i], MARKS[j])
            old = Scene.from_dict({"background": "snow", "objects": [
                {"kind": kind, "colour": "red", "size": size, "cell": 1, "jitter": [2, -1], "stamp": None}]})
            assert old.objects[0].mark is None and old.objects[0] == plain
            base = np.asarray(render_scene(Scene("snow", (plain,))))
            assert np.array_equal(np.asarray(render_scene(old)), base)
            assert all(np.abs(p - base).sum() > 0 for p in pictures)


def test_unmarked_scenes_keep_their_dict_and_key():
    obj = WorldObject("star", "blue", "large", 2, (1, 1))
    scene = Scene("beach", (obj,))
    assert scene.to_dict() == {"background": "beach", "objects": [
        {"kind": "star", "colour": "blue", "size": "large", "cell": 2, "jitter": [1, 1], "stamp": None}]}
    assert scene.layout_key() == ("beach", ((2, (1, 1), ("star", "blue", "large"), None),))
    marked = Scene("beach", (WorldObject("star", "blue", "large", 2, (1, 1), mark="dot"),))
    assert marked.to_dict()["objects"][0]["mark"] == "dot" and Scene.from_dict(marked.to_dict()) == marked
    assert marked.layout_key() != scene.layout_key() and marked.semantic_key() == scene.semantic_key()
    assert marked.objects[0].instance == ("star", "blue", "large", "dot")


def test_oacir_queries_anchor_an_instance(world):
    bench = load_benchmark(world, "test", "oacir")
    ann = load_oacir(world, "test")
    scenes = _scenes(world, "test")
    queries = read_jsonl(world / "benchmarks" / "test" / "oacir" / "queries.jsonl")
    assert len(bench.query_ids) == len(queries) == len(ann.instances) == ann.boxes.shape[0] >= N - 2
    assert ann.image_size == 64 and set(ann.gallery_instances) == set(scenes)
    for qi, q in enumerate(queries):
        assert bench.query_ids[qi] == q["id"] and bench.subsets[qi][0] == q["reference"]
        assert q["target"] in q["subset"] and len(set(q["subset"])) == len(q["subset"]) >= 7
        ref, target = scenes[q["reference"]], scenes[q["target"]]
        inst = q["instance"]
        assert ann.instances[qi] == inst and inst in ann.gallery_instances[q["target"]]
        assert all(o.mark is not None for s in (ref, target) for o in s.objects)
        anchor = next(o for o in ref.objects if instance_id(o) == inst)
        twin = [o for o in ref.objects if o.semantic == anchor.semantic and o is not anchor]
        assert len(twin) == 1 and instance_id(twin[0]) == q["twin"] != inst
        assert q["twin"] in ann.gallery_instances[q["reference"]]
        assert q["twin"] not in ann.gallery_instances[q["target"]]
        # the box lies on the anchored object: its centre is the anchor's cell centre plus its jitter
        x0, y0, x1, y1 = ann.boxes[qi].tolist()
        row, col = divmod(anchor.cell, 2)
        assert abs((x0 + x1) / 2 - (col * 32 + 16 + anchor.jitter[0])) <= 1
        assert abs((y0 + y1) / 2 - (row * 32 + 16 + anchor.jitter[1])) <= 1
        assert (x1 - x0) == pytest.approx(14.33 if anchor.size == "small" else 26.33, abs=0.01)
        t_anchor = next(o for o in target.objects if instance_id(o) == inst)
        assert len(q["instance_distractors"]) >= 3 and len(q["context_distractors"]) >= 2
        for n, gid in enumerate(q["instance_distractors"]):
            neg = scenes[gid]
            assert inst not in ann.gallery_instances[gid]
            other = [o for o in neg.objects if o.semantic == t_anchor.semantic and o.mark != t_anchor.mark]
            assert other and (n > 0 or other[0].mark == twin[0].mark)
        for gid in q["context_distractors"]:
            assert inst in ann.gallery_instances[gid] and gid != q["target"]
            assert q["twin"] not in ann.gallery_instances[gid]
    stats = oacir_statistics(world, "test")
    assert stats["quadruples"] == len(queries) and stats["instance_distractors_min"] >= 3
    assert stats["context_distractors_mean"] >= 2 and sum(stats["edit_types"].values()) == len(queries)


def test_oacir_is_deterministic_and_splits_are_disjoint(world, tmp_path):
    again = tmp_path / "again"
    assert main(["world", "oacir", "--world", str(world), "--queries", str(N), "--splits", "test",
                 "--out", str(again)]) == 0
    base = world / "benchmarks" / "test" / "oacir"
    for name in ("gallery.jsonl", "queries.jsonl", "oacir.json"):
        assert (again / "benchmarks" / "test" / "oacir" / name).read_bytes() == (base / name).read_bytes()
    for g in read_jsonl(base / "gallery.jsonl")[:10]:
        assert (again / g["image"]).read_bytes() == (world / g["image"]).read_bytes()
    keys = {s: {sc.layout_key() for sc in _scenes(world, s).values()} for s in ("train", "val", "test")}
    assert all(len(k) == len(_scenes(world, s)) for s, k in keys.items())
    assert not keys["train"] & keys["val"] and not keys["train"] & keys["test"] and not keys["val"] & keys["test"]
    own = set()
    for p in list((world / "pairs").glob("*.jsonl")) + list((world / "benchmarks").glob("*/[sm]*/gallery.jsonl")):
        own |= {Scene.from_dict(r["scene"]).layout_key() for r in read_jsonl(p)}
    # no OACIR image is a world image: every object of every OACIR scene carries a mark, and the world's have none
    # (a world layout redrawn with marks can occur: docs/world.md counts them)
    assert own and all(o.mark in MARKS for s in ("train", "val", "test") for sc in _scenes(world, s).values()
                       for o in sc.objects)
    assert not any(o.mark for p in (world / "pairs").glob("*.jsonl") for r in read_jsonl(p)
                   for o in Scene.from_dict(r["scene"]).objects)


def test_damaged_queries_line_is_named(world, tmp_path, capsys):
    import shutil
    copy = tmp_path / "w"
    shutil.copytree(world, copy, ignore=shutil.ignore_patterns("*.png"))
    path = copy / "benchmarks" / "val" / "oacir" / "queries.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2][:30] + "\n"
    path.write_text("".join(lines))
    with pytest.raises(ManifestError, match=r"queries\.jsonl:3"):
        load_benchmark(copy, "val", "oacir")
    with pytest.raises(ManifestError, match=r"queries\.jsonl:3"):
        load_oacir(copy, "val")
    # a valid but edited line is refused by the record's sha256
    lines = (world / "benchmarks" / "val" / "oacir" / "queries.jsonl").read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    with pytest.raises(ValueError, match="oacir.json"):
        load_benchmark(copy, "val", "oacir")
    assert main(["world", "oacir", "--world", str(copy), "--splits", "dev"]) != 0
    assert "--splits dev" in capsys.readouterr().err


@pytest.mark.slow
def test_oacir_from_the_command_line_world_to_adafocal_to_eval(tiny_world, tmp_path, capsys):
    """A user's path: `foco world oacir`, the three splits' features, `foco adafocal train`, `foco eval --protocols
    oacir` with R_ID@1, R@1, R@5 and Avg, the checkpoint's provenance checked against the features."""
    import json
    import shutil
    world, feats = tmp_path / "w", tmp_path / "f"
    shutil.copytree(tiny_world, world)  # the shared fixture stays read-only
    assert main(["world", "oacir", "--world", str(world), "--queries", "24"]) == 0
    assert "drafted left out" in capsys.readouterr().out
    for split in ("train", "val", "test"):
        assert main(["features", "extract", "--backbone", "world:vit", "--world", str(world), "--split",
                     f"{split}/oacir", "--out", str(feats / f"{split}-oacir")]) == 0
    ada = tmp_path / "ada"
    assert main(["adafocal", "train", "--features", str(feats), "--world", str(world), "--out", str(ada),
                 "--epochs", "1", "--batch-size", "8", "--probes", "2", "--layers", "1"]) == 0
    record = json.loads((ada / "adafocal.json").read_text())
    assert record["variant"] == "caam" and record["provenance"]["backbone"]["spec"] == "world:vit"
    assert record["data"]["quadruples"] == len(read_jsonl(world / "benchmarks" / "train" / "oacir" / "queries.jsonl"))
    res = tmp_path / "r.json"
    assert main(["eval", "--benchmark", "world", "--root", str(world), "--features", str(feats), "--protocols",
                 "oacir", "--split", "test", "--methods", "adafocal,image,sum", "--adafocal", str(ada),
                 "--out", str(res)]) == 0
    methods = json.loads(res.read_text())["methods"]
    for m in ("adafocal", "image", "sum"):
        assert set(methods[m]) == {"R_ID@1", "R@1", "R@5", "Avg"}
        assert methods[m]["R@1"] <= methods[m]["R@5"] and methods[m]["R@1"] <= methods[m]["R_ID@1"]
        assert abs(methods[m]["Avg"] - (methods[m]["R_ID@1"] + methods[m]["R@1"] + methods[m]["R@5"]) / 3) < 1e-9
    assert "| R_ID@1 | R@1 | R@5 | Avg |" in capsys.readouterr().out


def test_a_rerun_with_another_count_keeps_no_image_of_the_old_plan(world, tmp_path):
    out = tmp_path / "o"
    assert main(["world", "oacir", "--world", str(world), "--queries", "6", "--splits", "test", "--out", str(out)]) == 0
    assert main(["world", "oacir", "--world", str(world), "--queries", "4", "--splits", "test", "--out", str(out)]) == 0
    import json
    from foco.utils.io import sha256_file
    base = out / "benchmarks" / "test" / "oacir"
    record = json.loads((base / "oacir.json").read_text())
    gallery = read_jsonl(base / "gallery.jsonl")
    assert {g["image"] for g in gallery} == set(record["images_sha256"])
    assert all(sha256_file(out / rel) == digest for rel, digest in record["images_sha256"].items())
    on_disk = {p.relative_to(out).as_posix() for p in (base / "images").rglob("*.png")}
    assert on_disk == set(record["images_sha256"])  # nothing drawn for the first plan is left


def _copy_with_images(world, tmp_path):
    import shutil
    copy = tmp_path / "w"
    shutil.copytree(world, copy)
    return copy


def test_a_swapped_oacir_image_is_refused_by_verify_and_by_extraction(world, tmp_path, capsys):
    copy = _copy_with_images(world, tmp_path)
    gallery = read_jsonl(copy / "benchmarks" / "test" / "oacir" / "gallery.jsonl")
    a, b = copy / gallery[0]["image"], copy / gallery[1]["image"]
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    assert main(["world", "verify", str(copy)]) == 2
    err = capsys.readouterr().err
    assert gallery[0]["image"].split("/")[-1] in err and "oacir.json" in err
    assert main(["features", "extract", "--backbone", "world:vit", "--world", str(copy), "--split", "test/oacir",
                 "--out", str(tmp_path / "f")]) == 2
    assert "oacir.json" in capsys.readouterr().err


def test_an_edited_oacir_record_field_is_refused(world, tmp_path, capsys):
    import json
    import shutil
    copy = tmp_path / "w"
    shutil.copytree(world, copy, ignore=shutil.ignore_patterns("*.png"))
    path = copy / "benchmarks" / "val" / "oacir" / "oacir.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "image_size": record["image_size"] * 2}))
    with pytest.raises(ValueError, match="record_sha256"):
        load_benchmark(copy, "val", "oacir")


def test_verify_reads_every_oacir_protocol_of_a_world(world, capsys):
    assert main(["world", "verify", str(world)]) == 0
    out = capsys.readouterr().out
    assert all(f"{s}/oacir" in out for s in ("train", "val", "test")), out


def test_an_oacir_protocol_copied_into_another_world_is_refused_on_read(world, tiny_world, tmp_path):
    import shutil
    other = tmp_path / "other"
    shutil.copytree(tiny_world, other, ignore=shutil.ignore_patterns("*.png"))
    shutil.copytree(world / "benchmarks" / "val" / "oacir", other / "benchmarks" / "val" / "oacir")
    with pytest.raises(ValueError, match="written from another world"):
        load_benchmark(other, "val", "oacir")
