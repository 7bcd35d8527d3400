"""Issue 42, classes 1-2: one record schema per artifact kind, one provenance rule for every input, and contents
hashed. Each case is one the issue's probe found silently accepted, or a sibling of it."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from foco.cli import main


def _fails(argv, capsys, *needles) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def _eval(world, feats, *extra):
    return ["eval", "--benchmark", "world", "--root", world, "--split", "test", "--features", feats, *extra]


@pytest.fixture(scope="module")
def other_cache(tiny_world, tmp_path_factory):
    """test/single and test/multi of the tiny world, encoded by another random small world backbone."""
    from foco import create_backbone
    from foco.backbones.world import WorldCLIP, save_world_checkpoint
    from foco.world.splits import extract_world_split
    from test_train import SMALL
    root = tmp_path_factory.mktemp("other-cache")
    torch.manual_seed(11)
    save_world_checkpoint(WorldCLIP(SMALL), root / "bb")
    backbone = create_backbone(f"world:{root / 'bb'}")
    for protocol in ("single", "multi"):
        extract_world_split(backbone, tiny_world, f"test/{protocol}", root / f"test-{protocol}")
    return root


# --- schemas ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,needle", [
    ("heads", 0, "config.heads value 0 is below 1"),
    ("comp_depth", float("inf"), "Infinity is not a number JSON allows"),
    ("comp_depth", 10 ** 9, "config.comp_depth value 1000000000 is above 256"),
    ("dim", "32", "config.dim expected int"),
    ("heads", 5, "not a multiple of heads"),
    ("focus", "everywhere", "focus 'everywhere': choose one of"),
])
def test_a_damaged_checkpoint_config_names_the_file_and_the_field(tmp_path, field, value, needle):
    from foco.model import ComposedQueryEncoder, FoCoConfig
    ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(tmp_path, {"backbone": "world:pretrained"})
    meta = json.loads((tmp_path / "foco.json").read_text())
    meta["config"][field] = value
    (tmp_path / "foco.json").write_text(json.dumps(meta))  # Python's json writes inf as Infinity
    with pytest.raises(ValueError, match="foco.json") as err:
        ComposedQueryEncoder.load(tmp_path)
    assert needle in str(err.value)


def test_nan_and_infinity_are_refused_in_every_json_record(tmp_path):
    from foco.utils.io import ManifestError, iter_jsonl, read_json
    (tmp_path / "a.json").write_text('{"dim": NaN}')
    with pytest.raises(ManifestError, match=r"a.json: not valid JSON \(NaN is not a number JSON allows\)"):
        read_json(tmp_path / "a.json")
    (tmp_path / "b.jsonl").write_text('{"id": 1}\n{"id": -Infinity}\n')
    with pytest.raises(ManifestError, match=r"b.jsonl:2"):
        list(iter_jsonl(tmp_path / "b.jsonl"))


@pytest.mark.parametrize("dim,needle", [(float("inf"), "Infinity is not a number"),
                                        (10 ** 9, "field dim value 1000000000 is above 65536")])
def test_an_index_record_with_an_impossible_dim_is_refused_by_name(four_image_index, tmp_path, capsys, dim, needle):
    shutil.copytree(four_image_index, tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    (tmp_path / "idx" / "index.json").write_text(json.dumps({**meta, "dim": dim}))
    _fails(["search", "--index", tmp_path / "idx", "--text", "a red circle", "--reference", "1"], capsys, "index.json",
           needle, "foco index build")


# --- provenance ------------------------------------------------------------------------------------------------

def test_eval_refuses_parts_whose_features_came_from_different_backbones(tiny_world, eval_features, other_cache,
                                                                         tmp_path, capsys):
    mixed = tmp_path / "mixed"
    shutil.copytree(eval_features / "test-single", mixed / "test-single")
    shutil.copytree(other_cache / "test-multi", mixed / "test-multi")
    _fails(_eval(tiny_world, mixed, "--methods", "sum"), capsys, "backbones differ", "world/multi", "world/single")


def test_a_checkpoint_that_lost_its_backbone_is_refused_unless_unverified(tiny_world, eval_features, train_features,
                                                                          tmp_path, capsys):
    from foco.features import FeatureCache
    from foco.model import ComposedQueryEncoder, FoCoConfig
    spec = FeatureCache(train_features).manifest["backbone"]
    dim = FeatureCache(train_features).manifest["embed_dim"]
    ComposedQueryEncoder(FoCoConfig(dim=dim, heads=4)).save(tmp_path / "ck")  # no backbone recorded
    argv = _eval(tiny_world, eval_features, "--methods", "foco", "--checkpoint", tmp_path / "ck", "--backbone", spec,
                 "--protocols", "single")
    _fails(argv, capsys, "--checkpoint", "records no backbone", "--unverified")
    assert main([str(a) for a in argv] + ["--unverified", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "UNVERIFIED" in out and str(tmp_path / "ck") in out
    assert json.loads((tmp_path / "r.json").read_text())["unverified"] == [f"--checkpoint {tmp_path / 'ck'}"]


def test_foco_edits_refuses_a_checkpoint_without_the_edit_stage(tiny_world, eval_features, train_features, tmp_path,
                                                                capsys):
    from foco.features import FeatureCache
    from foco.model import ComposedQueryEncoder, FoCoConfig
    manifest = FeatureCache(train_features).manifest
    ComposedQueryEncoder(FoCoConfig(dim=manifest["embed_dim"], heads=4)).save(
        tmp_path / "ck", {"backbone": manifest["backbone"], "train": {"stage3_epochs": 0}})
    _fails(_eval(tiny_world, eval_features, "--methods", "foco-edits", "--foco-edits", tmp_path / "ck",
                 "--protocols", "single"), capsys, "--foco-edits", "without the edit stage", "stage3_epochs 0")


def test_train_refuses_an_edit_store_written_from_another_world(tiny_world, train_features, tmp_path, capsys):
    from foco.decompose.inputs import read_captions
    from foco.edits.rule import RuleWriter
    from foco.edits.run import GenerateConfig, run_generate
    sources = [(r.id, r.truth) for r in read_captions(tiny_world, split="train")]
    run_generate(sources, RuleWriter(), tmp_path / "e.sqlite", GenerateConfig(per_caption=1),
                 source={"input": "/elsewhere/world", "world": "0123456789abcdef"})
    _fails(["train", "--features", train_features, "--world", tiny_world, "--out", tmp_path / "o", "--edits",
            tmp_path / "e.sqlite", "--stage1-epochs", "1", "--stage2-epochs", "0"], capsys,
           "--edits", "another world", "0123456789abcdef")


def test_edits_generate_records_the_world_it_read(tiny_world, tmp_path, capsys):
    from foco.edits.store import EditStore
    from foco.world.generate import world_fingerprint
    assert main(["edits", "generate", "--in", str(tiny_world), "--out", str(tmp_path / "e.sqlite")]) == 0
    with EditStore(tmp_path / "e.sqlite") as store:
        assert store.runs()[0]["source"]["world"] == world_fingerprint(tiny_world)


def test_train_and_extract_refuse_two_swapped_captions(tiny_world, train_features, tmp_path, capsys):
    """The probe's case: two captions swapped in pairs/train.jsonl pass every count; world.json's sha256 does not."""
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world, symlinks=True)
    path = world / "pairs" / "train.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    a, b = json.loads(lines[0]), json.loads(lines[1])
    a["caption"], b["caption"] = b["caption"], a["caption"]
    lines[0], lines[1] = json.dumps(a) + "\n", json.dumps(b) + "\n"
    path.write_text("".join(lines))
    _fails(["features", "extract", "--world", world, "--split", "train", "--backbone", "world:pretrained", "--out",
            tmp_path / "f"], capsys, "train.jsonl", "sha256", "world.json")
    _fails(["train", "--features", train_features, "--world", world, "--out", tmp_path / "o"], capsys,
           "train.jsonl", "sha256")


# --- contents hashed -------------------------------------------------------------------------------------------

def test_a_shard_copied_from_another_backbones_cache_is_refused(tiny_world, eval_features, other_cache, tmp_path,
                                                               capsys):
    """The probe's case: another backbone's images shard and its record copied into a cache. Every shard matches
    its own record; the manifest's content hash does not."""
    cache = tmp_path / "feats"
    shutil.copytree(eval_features, cache)
    for name in ("shard-00000.safetensors", "shard-00000.json"):
        shutil.copy(other_cache / "test-single" / "images" / name, cache / "test-single" / "images" / name)
    assert main(["features", "verify", "--cache", str(cache / "test-single")]) != 0
    assert "content_sha256" in capsys.readouterr().out + capsys.readouterr().err
    _fails(_eval(tiny_world, cache, "--methods", "sum", "--protocols", "single"), capsys, "content_sha256",
           "test-single")


def test_index_update_refuses_changed_backbone_weights_unless_reencode(tiny_world, tmp_path, capsys):
    from foco.backbones.world import WorldCLIP, save_world_checkpoint
    from foco.search.build import IndexConfig, build_index, update_index
    from foco.search.engine import SearchEngine
    from test_train import SMALL
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(SMALL), tmp_path / "bb")
    (tmp_path / "imgs").mkdir()
    images = sorted((tiny_world / "images" / "test-single").glob("*.png"))
    for p in images[:4]:
        shutil.copy(p, tmp_path / "imgs" / p.name)
    build_index(IndexConfig(images=str(tmp_path / "imgs"), backbone=f"world:{tmp_path / 'bb'}"), tmp_path / "idx")
    torch.manual_seed(1)
    save_world_checkpoint(WorldCLIP(SMALL), tmp_path / "bb")  # the weights in that folder change
    shutil.copy(images[4], tmp_path / "imgs" / images[4].name)  # and a new image arrives
    before = json.loads((tmp_path / "idx" / "index.json").read_text())
    with pytest.raises(ValueError, match=r"index.json: its 4 vectors were encoded with other weights.*--reencode"):
        update_index(tmp_path / "idx")
    assert json.loads((tmp_path / "idx" / "index.json").read_text()) == before  # nothing written
    stats = update_index(tmp_path / "idx", reencode=True)
    assert stats.encoded == 5 and stats.indexed == 5
    engine = SearchEngine.open(tmp_path / "idx")
    assert engine.count() == 5 and engine.meta["backbone_sha256"] != before["backbone_sha256"]


def test_a_changed_index_file_is_refused_by_name(four_image_index, tmp_path, capsys):
    shutil.copytree(four_image_index, tmp_path / "idx")
    arrays = tmp_path / "idx" / "vectors" / "shard-00000.f32"
    data = bytearray(arrays.read_bytes())
    data[5] ^= 0x40
    arrays.write_bytes(bytes(data))
    _fails(["search", "--index", tmp_path / "idx", "--text", "a red circle", "--reference", "1"], capsys,
           "shard-00000.f32",
           "changed since it was written")


def test_a_checkpoints_weights_swapped_with_anothers_are_refused(tmp_path):
    from foco.model import ComposedQueryEncoder, FoCoConfig
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(tmp_path / name, {"backbone": "world:pretrained"})
    shutil.copy(tmp_path / "b" / "foco.safetensors", tmp_path / "a" / "foco.safetensors")
    with pytest.raises(ValueError, match="foco.safetensors does not match the weights_sha256"):
        ComposedQueryEncoder.load(tmp_path / "a")


def test_an_edited_store_value_is_caught_by_its_row_digest(tiny_world, tmp_path):
    import sqlite3
    from foco.decompose.inputs import read_captions
    from foco.edits.rule import RuleWriter
    from foco.edits.run import GenerateConfig, run_generate
    from foco.decompose.store import StoreError
    from foco.train.sources import edit_records
    sources = [(r.id, r.truth) for r in read_captions(tiny_world, split="train")][:20]
    run_generate(sources, RuleWriter(), tmp_path / "e.sqlite", GenerateConfig(per_caption=1))
    with sqlite3.connect(tmp_path / "e.sqlite") as db:
        db.execute("UPDATE triplets SET record = replace(record, 'a ', 'the ') WHERE rowid = 3")
    with pytest.raises(StoreError, match=r"e.sqlite: the triplet .* is damaged"):
        edit_records(tmp_path / "e.sqlite")


def test_a_mapper_config_that_builds_no_model_is_refused_by_name(tmp_path):
    """The probe's case: pic2word.json with hidden_dim -512 gave a tensor-size traceback."""
    from foco.methods.pic2word import Pic2WordConfig, Pic2WordMapper
    from foco.utils.schema import RecordError
    Pic2WordMapper(Pic2WordConfig(image_dim=32, token_dim=32, hidden_dim=16)).save(tmp_path / "p2w")
    meta = json.loads((tmp_path / "p2w" / "pic2word.json").read_text())
    meta["config"]["hidden_dim"] = -512
    (tmp_path / "p2w" / "pic2word.json").write_text(json.dumps(meta))
    with pytest.raises(RecordError, match=r"pic2word.json: field config.*hidden_dim is -512"):
        Pic2WordMapper.load(tmp_path / "p2w")
    meta["config"]["hidden_dim"] = "wide"
    (tmp_path / "p2w" / "pic2word.json").write_text(json.dumps(meta))
    with pytest.raises(RecordError, match=r"pic2word.json: its config does not build the model"):
        Pic2WordMapper.load(tmp_path / "p2w")


@pytest.mark.parametrize("field,value,needle", [("embed_dim", "big", "config.embed_dim expected int"),
                                                ("widths", [32, 64], "config.widths length 2 is below 3"),
                                                ("image_size", -64, "config.image_size value -64 is below 8")])
def test_a_world_backbone_config_that_is_damaged_is_refused_by_name(tmp_path, field, value, needle):
    from foco.backbones.world import WorldCLIP, load_world_backbone, save_world_checkpoint
    from foco.utils.schema import RecordError
    from test_train import SMALL
    save_world_checkpoint(WorldCLIP(SMALL), tmp_path / "bb")
    meta = json.loads((tmp_path / "bb" / "config.json").read_text())
    meta["config"][field] = value
    (tmp_path / "bb" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(RecordError, match="config.json") as err:
        load_world_backbone(tmp_path / "bb")
    assert needle in str(err.value)


@pytest.mark.slow  # two processes or a training run: about 4-5 s each (issue 53: make test-fast within 2 minutes)
@pytest.mark.parametrize("damage", ["progress", "tensors"])
def test_a_damaged_training_state_is_refused_on_resume_by_name(tiny_world, train_features, tmp_path, capsys, damage):
    args = ["train", "--features", train_features, "--world", tiny_world, "--out", tmp_path / "o",
            "--stage1-epochs", "1", "--stage2-epochs", "1", "--batch-size", "128"]
    assert main([str(a) for a in args]) == 0
    state = tmp_path / "o" / "train_state"
    if damage == "progress":
        meta = json.loads((state / "state.json").read_text())
        (state / "state.json").write_text(json.dumps({**meta, "progress": "x"}))
        needles = ("state.json", "field progress expected dict")
    else:
        from safetensors.torch import load_file, save_file
        tensors = load_file(state / "state.safetensors")
        name = next(k for k in tensors if k.startswith("model/"))
        tensors[name] = tensors[name] + 1  # a valid file of other values
        save_file(tensors, state / "state.safetensors")
        needles = ("state.safetensors does not match the tensors_sha256",)
    capsys.readouterr()
    _fails([*args, "--resume"], capsys, *needles)


def test_an_index_record_that_lost_its_weights_hash_is_refused_unless_reencode_or_unverified(four_image_index,
                                                                                          tmp_path, capsys):
    from foco.search.build import update_index
    from foco.search.engine import SearchEngine
    shutil.copytree(four_image_index, tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    del meta["backbone_sha256"]
    (tmp_path / "idx" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="records no backbone_sha256.*--reencode"):
        update_index(tmp_path / "idx")
    with pytest.raises(ValueError, match="records no backbone_sha256.*--unverified"):
        SearchEngine.open(tmp_path / "idx")
    assert SearchEngine.open(tmp_path / "idx", unverified=True).count() == 4
    assert update_index(tmp_path / "idx", reencode=True).encoded == 4
    assert json.loads((tmp_path / "idx" / "index.json").read_text())["backbone_sha256"]


def test_a_checkpoint_that_lost_its_provenance_record_is_refused_unless_unverified(tmp_path):
    from foco.methods import MethodOptions
    from foco.methods.provenance import check_trained_on
    from foco.model import ComposedQueryEncoder, FoCoConfig
    spec = "world:pretrained"
    ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(tmp_path / "ck", {
        "backbone": spec, "train": {"seed": 0}, "provenance": {"backbone": {"spec": spec}}})
    check_trained_on(MethodOptions(checkpoint=tmp_path / "ck"), {"spec": spec}, "the features", "fix")
    meta = json.loads((tmp_path / "ck" / "foco.json").read_text())
    del meta["provenance"]
    (tmp_path / "ck" / "foco.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="records no backbone.*--unverified"):
        check_trained_on(MethodOptions(checkpoint=tmp_path / "ck"), {"spec": spec}, "the features", "fix")
    check_trained_on(MethodOptions(checkpoint=tmp_path / "ck", unverified=True), {"spec": spec}, "the features", "fix")


# --- a second, independent probe's findings ---------------------------------------------------------------------

def test_a_key_given_twice_or_a_number_beyond_a_float_is_refused_by_file(tmp_path):
    from foco.model import ComposedQueryEncoder, FoCoConfig
    ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(tmp_path, {"backbone": "world:pretrained"})
    text = (tmp_path / "foco.json").read_text()
    (tmp_path / "foco.json").write_text(text.replace('"heads": 4,', '"heads": 4, "heads": 8,', 1))
    with pytest.raises(ValueError, match=r"foco.json: not valid JSON \(the key 'heads' appears twice"):
        ComposedQueryEncoder.load(tmp_path)
    from foco.utils.io import ManifestError, iter_jsonl
    (tmp_path / "m.jsonl").write_text('{"id": "1", "jitter": [1e400, 3]}\n')
    with pytest.raises(ManifestError, match=r"m.jsonl:1: not valid JSON \(1e400 is beyond a 64-bit float"):
        list(iter_jsonl(tmp_path / "m.jsonl"))


def test_an_index_of_a_newer_format_is_refused(four_image_index, tmp_path, capsys):
    shutil.copytree(four_image_index, tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    (tmp_path / "idx" / "index.json").write_text(json.dumps({**meta, "format_version": 99}))
    _fails(["search", "--index", tmp_path / "idx", "--text", "a red circle", "--reference", "1"], capsys,
           "format_version 99 was written by a newer foco")


def test_a_world_line_of_the_wrong_type_is_refused_even_when_rehashed(tiny_world, tmp_path):
    """An edited manifest whose world.json was updated to match (a user's edit, not damage) is still typed."""
    import hashlib
    from foco.utils.io import ManifestError
    from foco.world.manifest import load_benchmark
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world, symlinks=True)
    rel = "benchmarks/test/single/queries.jsonl"
    lines = (world / rel).read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "id": 12345}) + "\n"
    (world / rel).write_text("".join(lines))
    summary = json.loads((world / "world.json").read_text())
    summary["manifests_sha256"][rel] = hashlib.sha256((world / rel).read_bytes()).hexdigest()
    (world / "world.json").write_text(json.dumps(summary))
    with pytest.raises(ManifestError, match=r"queries.jsonl:1: field id should be a string"):
        load_benchmark(world, "test", "single")


@pytest.mark.parametrize("text", ["\ufe0f\u200b", "\u0301\u0301", "\ufe0f\ufe0f\ufe0e", "\u00ad"])
def test_text_of_marks_and_format_characters_alone_is_blank(text):
    from foco.utils.text import text_problem
    assert "blank" in text_problem(text)
    assert text_problem("e\u0301") is None and text_problem("caf\u00e9 \u2764\ufe0f") is None


def test_an_artifact_is_never_written_inside_another_even_with_force(tiny_world, four_image_index, tmp_path, capsys):
    shutil.copytree(four_image_index, tmp_path / "idx")
    for extra in ([], ["--force"]):
        _fails(["features", "extract", "--world", tiny_world, "--split", "test/single", "--backbone",
                "world:pretrained", "--out", tmp_path / "idx" / "vectors", *extra], capsys,
               "is inside", "holds a search index", "writes a feature cache")
    assert sorted(p.name for p in (tmp_path / "idx" / "vectors").iterdir()) == ["shard-00000.f32"]


def test_a_world_record_that_is_a_folder_and_a_zero_memory_budget_are_refused(tiny_world, tmp_path):
    from foco.search.vectors import parse_bytes
    from foco.utils.io import ManifestError
    from foco.world.generate import world_fingerprint
    from foco.world.manifest import load_pairs
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world, symlinks=True)
    (world / "world.json").unlink()
    (world / "world.json").mkdir()
    with pytest.raises(ManifestError, match="world.json is not a file"):
        world_fingerprint(world)
    with pytest.raises(ManifestError, match="world.json is not a file"):
        load_pairs(world, "train")
    for value in ("0B", "0", "512KB"):
        with pytest.raises(ValueError, match="at least 1MB"):
            parse_bytes(value)
    assert parse_bytes("1MB") == 1024 ** 2


def test_extraction_refuses_two_swapped_world_images(tiny_world, tmp_path, capsys):
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world)
    a, b = sorted((world / "images" / "test-single").glob("*.png"))[:2]
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)
    _fails(["features", "extract", "--world", world, "--split", "test/single", "--backbone", "world:pretrained",
            "--out", tmp_path / "f"], capsys, a.name, "images.sha256", "foco world verify")
