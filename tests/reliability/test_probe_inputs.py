"""Issue 24's probe, classes 3 to 7: numbers that are not finite, text the parsers cannot take, writing over what
foco did not write, an index that keeps what it cannot read, and request fields parsed by hand (with the server's
fuzz test in test_serve_fuzz.py). Each case is an input a user can give."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from foco.cli import build_parser, main


def _fails(argv, capsys, *needles) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    for n in needles:
        assert n in err, err
    return err


# --- class 3: finite or stop --------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["train", "--features", "f", "--world", "w", "--out", "o", "--lr-aggr", "inf"],
    ["train", "--features", "f", "--world", "w", "--out", "o", "--preserve-weight", "-nan"],
    ["pic2word", "train", "--features", "f", "--out", "o", "--lr", "1e999"],
    ["backbone", "train", "--world", "w", "--out", "o", "--lr", "NaN"],
    ["eval", "--benchmark", "world", "--root", "w", "--chord-shortlist", "1.5"],
])
def test_non_finite_and_non_integral_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_eval_refuses_a_non_finite_slerp_alpha(tiny_world, capsys):
    _fails(["eval", "--benchmark", "world", "--root", tiny_world, "--backbone", "world:pretrained",
            "--slerp-alpha", "inf", "--methods", "slerp"], capsys, "finite")


def test_a_nan_feature_stops_training_before_a_checkpoint(tiny_world, train_features, tmp_path, capsys):
    """NaNs in the cached features (a damaged extraction) stop the first step; no checkpoint of NaNs is saved."""
    import numpy as np
    from safetensors.torch import load_file, save_file
    cache = tmp_path / "c"
    shutil.copytree(train_features, cache)
    shard = cache / "images" / "shard-00000.safetensors"
    t = load_file(shard)
    t["global"][:, 0] = float("nan")
    save_file(t, shard)
    rec = json.loads((cache / "images" / "shard-00000.json").read_text())
    import hashlib
    rec["sha256"], st = hashlib.sha256(shard.read_bytes()).hexdigest(), shard.stat()
    rec["bytes"], rec["mtime_ns"] = st.st_size, st.st_mtime_ns
    (cache / "images" / "shard-00000.json").write_text(json.dumps(rec))
    from foco.features import content_sha256  # as an extraction that wrote NaNs would have recorded them
    manifest = json.loads((cache / "manifest.json").read_text())
    n = -(-manifest["images"]["count"] // manifest["shard_size"])
    manifest["images"]["content_sha256"] = content_sha256(
        [json.loads((cache / "images" / f"shard-{s:05d}.json").read_text()) for s in range(n)])
    (cache / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "o"
    err = _fails(["train", "--features", cache, "--world", tiny_world, "--out", out, "--stage1-epochs", "1",
                  "--stage2-epochs", "0", "--batch-size", "64"], capsys, "not finite", "stage 1")
    assert not (out / "foco.safetensors").exists() and np.isfinite(1.0), err


# --- class 4: text the parsers cannot take ------------------------------------------------------------------------

@pytest.mark.parametrize("suffix,body,line", [
    (".tsv", "caption\turl\na red\x00 square\thttp://x/1.jpg\n", 2),
    (".csv", "id,caption\n1,a blue circle\n2,a blue \x1b[31mcircle\n", 3),
    (".jsonl", json.dumps({"id": "1", "caption": "a green\u0007 star"}) + "\n", 1),
    (".tsv", "caption\turl\na red square\u0085 on grass\thttp://x/1.jpg\n", 2),  # a C1 control (NEL)
])
def test_control_characters_in_captions_are_refused_naming_file_and_line(suffix, body, line, tmp_path, capsys):
    path = tmp_path / f"caps{suffix}"
    path.write_text(body, encoding="utf-8")
    err = _fails(["decompose", "--in", path, "--decomposer", "rule", "--out", tmp_path / "s.sqlite"], capsys,
                 f"{path}:{line}", "control character")
    assert not (tmp_path / "s.sqlite").exists(), err


def test_tabs_inside_a_json_caption_are_whitespace_not_refused(tmp_path):
    from foco.decompose.inputs import read_captions
    path = tmp_path / "caps.jsonl"
    path.write_text(json.dumps({"id": "1", "caption": "a red\tsquare\non grass"}) + "\n")
    assert read_captions(path)[0].caption == "a red\tsquare\non grass"


def test_a_caption_beyond_the_parser_limit_is_decomposed_in_pieces_and_its_batch_stored(tmp_path, monkeypatch):
    pytest.importorskip("spacy")
    from foco.decompose import rule
    from foco.decompose.rule import RuleDecomposer, split_pieces
    from foco.decompose.run import run_decompose
    from foco.decompose.store import DecompositionStore
    monkeypatch.setattr(rule, "PIECE_CHARS", 120)
    long = " ".join(["a red circle next to a blue star on a sandy beach"] * 12)  # 600 characters
    captions = ["a dog on a sofa", long, "a cat under a table"]
    stats = run_decompose(captions, RuleDecomposer(), tmp_path / "s.sqlite", show_progress=False)
    assert stats.done_now == 3
    with DecompositionStore(tmp_path / "s.sqlite") as store:
        sid = store.register(RuleDecomposer().settings)
        assert len(store.done_hashes(sid)) == 3
    d = RuleDecomposer().decompose(long)
    assert d.caption == long and d.pairs and all(len(p.context) <= 120 for p in d.pairs)  # parsed piece by piece
    pieces = split_pieces(long, 120)
    assert "".join(pieces) == long and max(map(len, pieces)) <= 120


def test_edits_read_a_caption_beyond_the_parser_limit_in_pieces_as_decompose_does(monkeypatch):
    """Issue 42 class 5: `edits generate` parsed every caption whole, and a 1.2-million-character one stopped it
    at spaCy's limit; it now cuts it where decompose does. Here the limit is 200 characters, the pieces 120."""
    pytest.importorskip("spacy")
    from foco.decompose import rule
    from foco.decompose.rule import RuleDecomposer, load_spacy
    from foco.edits.derive import PhrasePool
    monkeypatch.setattr(rule, "PIECE_CHARS", 120)
    nlp = load_spacy()
    monkeypatch.setattr(nlp, "max_length", 200)
    long = " ".join(["a red circle next to a blue star on a sandy beach"] * 12)  # 600 characters
    decs = [RuleDecomposer().decompose(c) for c in ("a dog on a sofa", long, "a cat under a table")]
    with pytest.raises(ValueError, match="max_length"):  # the limit holds: a whole caption is refused by spaCy
        list(nlp.pipe([long]))
    pool = PhrasePool.build(decs, nlp=nlp, min_shared_heads=1)
    assert "circle" in {head for head, _ in pool.parse.values()}



def _circo(root: Path, caption: str) -> Path:
    from PIL import Image
    (root / "COCO2017_unlabeled" / "annotations").mkdir(parents=True)
    (root / "COCO2017_unlabeled" / "unlabeled2017").mkdir(parents=True)
    (root / "annotations").mkdir()
    for i in (1, 2):
        Image.new("RGB", (8, 8)).save(root / "COCO2017_unlabeled" / "unlabeled2017" / f"{i:012d}.jpg")
    (root / "COCO2017_unlabeled" / "annotations" / "image_info_unlabeled2017.json").write_text(json.dumps(
        {"images": [{"id": i, "file_name": f"{i:012d}.jpg"} for i in (1, 2)]}))
    (root / "annotations" / "val.json").write_text(json.dumps([
        {"id": 0, "reference_img_id": 1, "target_img_id": 2, "relative_caption": caption, "shared_concept": "",
         "gt_img_ids": [2]}]))
    return root


@pytest.mark.parametrize("caption,why", [("", "is empty"), ("   ", "is empty"), ("has a \x00 in it", "U+0000")])
def test_circo_refuses_an_empty_or_controlled_relative_caption(caption, why, tmp_path):
    from foco.benchmarks import read_benchmark
    from foco.utils.io import ManifestError
    root = _circo(tmp_path / "circo", caption)
    with pytest.raises(ManifestError, match=f"relative_caption.*{re.escape(why)}"):
        read_benchmark("circo", root, "val")


def test_circo_reads_a_plain_relative_caption(tmp_path):
    from foco.benchmarks import read_benchmark
    root = _circo(tmp_path / "circo", "is a dog instead")
    assert read_benchmark("circo", root, "val")[0].queries[0].texts == ("is a dog instead",)


def test_cirr_refuses_an_empty_caption(tiny_world, tmp_path):
    from foco.benchmarks import read_benchmark
    from foco.benchmarks.export import export_world
    from foco.utils.io import ManifestError
    export_world(tiny_world, "cirr", "val", tmp_path / "cirr")
    path = tmp_path / "cirr" / "captions" / "cap.rc2.val.json"
    entries = json.loads(path.read_text())
    entries[1]["caption"] = " "
    path.write_text(json.dumps(entries))
    with pytest.raises(ManifestError, match=r"'caption' is empty.*pairid"):
        read_benchmark("cirr", tmp_path / "cirr", "val")


# --- class 5: write only into what foco owns ----------------------------------------------------------------------

def _user_folder(path: Path, name: str = "notes.txt") -> Path:
    path.mkdir(parents=True)
    (path / name).write_text("the user's own file\n")
    return path


def test_export_never_replaces_a_dataset_annotation(tiny_world, tmp_path, capsys):
    """The issue's data loss: pointed at a real CIRR folder, export replaced its annotations."""
    root = tmp_path / "CIRR"
    (root / "captions").mkdir(parents=True)
    (root / "captions" / "cap.rc2.val.json").write_text("[the real annotations]")
    _fails(["world", "export", "--world", tiny_world, "--format", "cirr", "--out", root], capsys,
           "foco did not write", "--force")
    assert (root / "captions" / "cap.rc2.val.json").read_text() == "[the real annotations]"
    assert sorted(p.name for p in root.rglob("*")) == ["cap.rc2.val.json", "captions"]  # nothing else written


def test_export_with_force_writes_beside_a_users_files_and_reexports_freely(tiny_world, tmp_path, capsys):
    root = _user_folder(tmp_path / "x")
    assert main(["world", "export", "--world", str(tiny_world), "--format", "circo", "--split", "val", "--out",
                 str(root), "--force"]) == 0
    assert (root / "notes.txt").read_text() == "the user's own file\n"
    assert main(["world", "export", "--world", str(tiny_world), "--format", "circo", "--split", "val",
                 "--out", str(root)]) == 0  # foco's own export: updated without --force
    (root / "annotations" / "val.json").unlink()
    (root / "annotations" / "val.json").write_text("[]")  # replaced by a user's file of the same name
    assert main(["world", "export", "--world", str(tiny_world), "--format", "circo", "--split", "val",
                 "--out", str(root)]) == 0  # listed as foco's: replaced (it is foco's output name there)


# Every command that writes a folder: pointed at a folder of a user's files, it refuses and touches nothing.
WRITING = {
    "world generate": lambda w, f, o: ["world", "generate", "--out", o, "--size", "tiny"],
    "world ambiguous": lambda w, f, o: ["world", "ambiguous", "--world", w, "--out", o],
    "world export": lambda w, f, o: ["world", "export", "--world", w, "--format", "fashioniq", "--out", o],
    "world export webdataset": lambda w, f, o: ["world", "export", "--world", w, "--format", "webdataset", "--out", o],
    "edits rewrite": lambda w, f, o: ["edits", "rewrite", "--root", w, "--out", o],
    "features extract": lambda w, f, o: ["features", "extract", "--backbone", "world:pretrained", "--world", w,
                                         "--split", "train", "--out", o],
    "train": lambda w, f, o: ["train", "--features", f, "--world", w, "--out", o],
    "pic2word train": lambda w, f, o: ["pic2word", "train", "--features", f, "--out", o],
    "pact train": lambda w, f, o: ["pact", "train", "--features", f, "--edits", "e.sqlite", "--out", o],
    "tscir train": lambda w, f, o: ["tscir", "train", "--features", f, "--edits", "e.sqlite", "--out", o],
    "backbone train": lambda w, f, o: ["backbone", "train", "--world", w, "--out", o],
    "index build": lambda w, f, o: ["index", "build", "--images", Path(w) / "images", "--backbone",
                                    "world:pretrained", "--out", o],
    "quickstart": lambda w, f, o: ["quickstart", "--out", o, "--size", "tiny"],
    "ablate": lambda w, f, o: ["ablate", "--world", w, "--features", f, "--out", o],
}


@pytest.mark.parametrize("command", sorted(WRITING))
def test_every_writing_command_refuses_a_folder_it_did_not_write(command, tiny_world, train_features, tmp_path,
                                                                  capsys):
    folder = _user_folder(tmp_path / "mine")
    argv = WRITING[command](tiny_world, train_features, folder)
    try:
        build_parser().parse_args([str(a) for a in argv])
    except SystemExit:
        pytest.fail(f"{command}: the test's arguments do not parse")
    _fails(argv, capsys, "foco did not write", "notes.txt", "--force")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert (folder / "notes.txt").read_text() == "the user's own file\n"


def _kind_of(argv) -> str:
    a = build_parser().parse_args([str(x) for x in argv])
    (kind,) = {out.kind for out in a._rules.writes if out.dest == "out"}  # its declared --out (foco.cli.rules)
    return kind


@pytest.mark.parametrize("command", sorted(WRITING))
@pytest.mark.parametrize("recorded", [True, False])  # an owner file that records the kind, or an older folder
def test_every_writing_command_refuses_another_kind_of_artifact_for_that_reason(command, recorded, tiny_world,
                                                                                train_features, tmp_path, capsys):
    """Issue 42 item 7: a folder of another kind (a FoCo checkpoint; for `train`, a Pic2Word mapper) is refused,
    with or without --force, naming what it holds and what the command writes; nothing is written into it."""
    import json
    from foco.utils.ownership import MARKER, mark_folder
    folder = tmp_path / "other"
    folder.mkdir()
    kind = _kind_of(WRITING[command](tiny_world, train_features, folder))
    other, record = ("Pic2Word mapper", "pic2word.json") if kind == "FoCo checkpoint" else \
        ("FoCo checkpoint", "foco.json")
    (folder / record).write_text(json.dumps({"model": {}}) + "\n")
    if recorded:
        mark_folder(folder, "some command", other)
    before = sorted(p.name for p in folder.iterdir())
    for force in ([], ["--force"]):
        argv = [*WRITING[command](tiny_world, train_features, folder), *force]
        _fails(argv, capsys, f"holds a {other}", f"writes a {kind}", "choose another --out")
        assert sorted(p.name for p in folder.iterdir()) == before
    assert recorded == (MARKER in before)


def test_a_folder_records_the_kind_its_command_wrote(tiny_world, tmp_path):
    from foco.utils.ownership import folder_kind
    from foco.cli import main
    out = tmp_path / "w"
    assert main(["world", "ambiguous", "--world", str(tiny_world), "--out", str(out), "--queries", "2"]) == 0
    assert json.loads((out / ".foco-owner.json").read_text())["kind"] == "world" == folder_kind(out)


def test_a_folder_an_earlier_foco_wrote_is_still_resumed(tiny_world, train_features, tmp_path):
    """Folders from before the owner file (their signature file) resume without --force."""
    from foco.utils.ownership import MARKER, check_folder
    cache = tmp_path / "c"
    shutil.copytree(train_features, cache)
    (cache / MARKER).unlink(missing_ok=True)
    check_folder(cache, ("manifest.json",))  # no error


def test_submission_files_never_replace_a_users_file(tiny_world, tmp_path, capsys):
    from foco.benchmarks.export import export_world
    export_world(tiny_world, "cirr", "test", tmp_path / "cirr")
    subs = _user_folder(tmp_path / "subs", "cirr_test_sum_recall.json")
    _fails(["eval", "--benchmark", "cirr", "--root", tmp_path / "cirr", "--split", "test", "--backbone",
            "world:pretrained", "--methods", "sum", "--cache", tmp_path / "cache", "--submission-dir", subs], capsys,
           "cirr_test_sum_recall.json", "foco did not write")
    assert (subs / "cirr_test_sum_recall.json").read_text() == "the user's own file\n"


def test_a_store_is_never_written_into_another_applications_database(tmp_path, capsys):
    import sqlite3
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE users (name TEXT)")
    caps = tmp_path / "c.csv"
    caps.write_text("id,caption\n1,a red square\n")
    _fails(["decompose", "--in", caps, "--decomposer", "rule", "--out", db], capsys, "users", "not a foco")
    with sqlite3.connect(db) as c:
        assert [n for (n,) in c.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["users"]


def test_a_store_of_another_kind_is_refused_for_that_reason(tiny_world, tmp_path, capsys):
    """Issue 42 item 7 (stores): `edits generate --out` a decomposition store, and `decompose --out` an edit store,
    are refused naming the store's kind; neither store gains the other's tables."""
    import sqlite3
    caps = tmp_path / "c.csv"
    caps.write_text("id,caption\n1,a red square on a beach\n")
    dec, edits = tmp_path / "d.sqlite", tmp_path / "e.sqlite"
    assert main(["decompose", "--in", str(caps), "--decomposer", "rule", "--out", str(dec)]) == 0
    assert main(["edits", "generate", "--in", str(tiny_world), "--out", str(edits), "--limit", "3"]) == 0
    capsys.readouterr()

    def tables(db):
        with sqlite3.connect(db) as c:
            return sorted(n for (n,) in c.execute("SELECT name FROM sqlite_master WHERE type='table'"))
    before = tables(dec), tables(edits)
    _fails(["edits", "generate", "--in", tiny_world, "--out", dec, "--limit", "3"], capsys,
           "is a foco decomposition store, not an edit store", "choose another --out")
    _fails(["decompose", "--in", caps, "--decomposer", "rule", "--out", edits], capsys,
           "is a foco edit store, not a decomposition store")
    assert (tables(dec), tables(edits)) == before


# --- class 6: index consistency -----------------------------------------------------------------------------------

@pytest.fixture()
def small_index(tiny_world, tmp_path):
    pytest.importorskip("faiss")
    from foco.search.build import IndexConfig, build_index
    folder = tmp_path / "imgs"
    folder.mkdir()
    for p in sorted((tiny_world / "images" / "test-single").glob("*.png"))[:6]:
        shutil.copy(p, folder / p.name)
    build_index(IndexConfig(images=str(folder), backbone="world:pretrained"), tmp_path / "idx")
    return folder, tmp_path / "idx"


def test_a_file_overwritten_with_garbage_is_removed_on_update(small_index, capsys):
    from foco.search.engine import SearchEngine
    folder, idx = small_index
    victim = sorted(folder.glob("*.png"))[0]
    victim.write_bytes(b"not an image any more" * 10)
    assert main(["index", "update", str(idx)]) == 0
    assert "can no longer be read" in capsys.readouterr().err
    engine = SearchEngine.open(idx)
    assert victim.name not in {r.path for r in engine.store.rows().values()}
    assert victim.name in (idx / "skipped.tsv").read_text()


def test_a_changed_file_is_never_served_with_its_old_vector(small_index):
    """Before any update: the file under an indexed path changed; a search must not return it as it was."""
    import numpy as np
    from foco.search.engine import SearchEngine
    folder, idx = small_index
    engine = SearchEngine.open(idx)
    rows = engine.store.rows()
    target = rows[sorted(rows)[0]]
    vec = engine.store.vector_rows([target.id])[0]
    assert engine.search_vector(vec.astype(np.float64), 3)[0].id == target.id
    other = sorted(folder.glob("*.png"))[-1]
    shutil.copy(other, folder / target.path)  # new bytes under the old name
    os.utime(folder / target.path, ns=(target.mtime_ns + 10 ** 9, target.mtime_ns + 10 ** 9))
    assert target.id not in [h.id for h in engine.search_vector(vec.astype(np.float64), 3)]


def test_a_deleted_file_is_not_served(small_index):
    import numpy as np
    from foco.search.engine import SearchEngine
    folder, idx = small_index
    engine = SearchEngine.open(idx)
    rows = engine.store.rows()
    target = rows[sorted(rows)[1]]
    vec = engine.store.vector_rows([target.id])[0]
    (folder / target.path).unlink()
    assert target.id not in [h.id for h in engine.search_vector(vec.astype(np.float64), 3)]


def _world_copy(tiny_world: Path, out: Path) -> Path:
    shutil.copytree(tiny_world, out, ignore=shutil.ignore_patterns("images"))
    (out / "images").symlink_to(tiny_world / "images", target_is_directory=True)
    return out


def test_every_world_reader_refuses_a_deleted_query_line(tiny_world, tmp_path):
    from foco.benchmarks import read_benchmark
    from foco.utils.io import ManifestError
    world = _world_copy(tiny_world, tmp_path / "w")
    path = world / "benchmarks" / "val" / "single" / "queries.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(ManifestError, match="world.json counts"):
        read_benchmark("world", world, "val")


def test_a_world_modification_with_a_control_character_is_refused(tiny_world, tmp_path):
    from foco.benchmarks import read_benchmark
    from foco.utils.io import ManifestError
    world = _world_copy(tiny_world, tmp_path / "w")
    path = world / "benchmarks" / "val" / "multi" / "queries.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    rec = json.loads(lines[2])
    rec["modification"] = "make it\x00 red"
    path.write_text("".join(lines[:2]) + json.dumps(rec) + "\n" + "".join(lines[3:]))
    with pytest.raises(ManifestError, match=r"queries.jsonl:3: the modification holds the control character U\+0000"):
        read_benchmark("world", world, "val")


def test_search_refuses_a_control_character_in_the_text(small_index):
    from foco.search.engine import Query, QueryError, SearchEngine
    _, idx = small_index
    engine = SearchEngine.open(idx)
    with pytest.raises(QueryError, match="control character"):
        engine.search(Query(text="make it\x1b red", reference=1, method="sum", k=2))


def test_eval_out_never_replaces_a_file_that_is_not_its_results(tiny_world, tmp_path, capsys):
    out = tmp_path / "paper.json"
    out.write_text('{"title": "my draft"}')
    _fails(["eval", "--benchmark", "world", "--root", tiny_world, "--backbone", "world:pretrained",
            "--methods", "sum", "--out", out], capsys, "not a results file", "--force")
    assert out.read_text() == '{"title": "my draft"}'


def test_a_folder_entered_with_force_stays_the_users(tiny_world, train_features, tmp_path, capsys):
    """--force writes beside a user's files once; it does not make the folder foco's for the next command."""
    folder = _user_folder(tmp_path / "mine")
    assert main(["world", "export", "--world", str(tiny_world), "--format", "fashioniq", "--out", str(folder),
                 "--force"]) == 0
    _fails(["features", "extract", "--backbone", "world:pretrained", "--world", tiny_world, "--split", "train",
            "--out", folder], capsys, "foco did not write", "--force")


def test_a_hugging_face_folder_is_not_taken_for_a_world_backbone(tmp_path, capsys):
    folder = tmp_path / "clip-vit-base-patch32"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "clip"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    _fails(["backbone", "train", "--world", tmp_path / "w", "--out", folder], capsys, "foco did not write")
    assert (folder / "model.safetensors").read_bytes() == b"weights"


def test_an_embedding_beyond_float32_is_refused(small_index):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from foco.search.engine import SearchEngine
    from foco.serve.app import ServeLimits, create_app
    _, idx = small_index
    engine = SearchEngine.open(idx)
    c = TestClient(create_app(engine, ServeLimits()))
    for emb in ([1e39] + [0.0] * (engine.dim - 1), [1e-46] * engine.dim):
        r = c.post("/knn-service", json={"embedding_input": emb, "num_images": 2})
        assert r.status_code == 400 and "float32" in r.json()["error"], r.text
    r = c.post("/knn-service", json={"embedding_input": [0.1] * engine.dim, "num_images": 2, "aesthetic_weight": "0.5",
                                     "aesthetic_score": ""})
    assert r.status_code == 200 and len(r.json()) == 2  # clip-front's string fields are accepted


@pytest.mark.parametrize("line,field", [('{"id": "a\\ud800", "caption": "a red circle"}', "field id"),
                                        ('{"id": "1", "caption": "a red circle", "meta": {"tags": ["x\\udfff"]}}',
                                         "field meta.tags[0]")])
def test_a_lone_surrogate_in_any_jsonl_field_is_refused_by_file_line_and_field(tmp_path, capsys, line, field):
    """Issue 42 class 5: the caption was checked, other fields (an id) reached the codec when written."""
    path = tmp_path / "captions.jsonl"
    path.write_text('{"id": "0", "caption": "a blue star"}\n' + line + "\n")
    assert main(["decompose", "--in", str(path), "--decomposer", "rule", "--out", str(tmp_path / "s.sqlite")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: {field} holds a lone surrogate" in err and "Traceback" not in err, err
    assert not (tmp_path / "s.sqlite").exists()
