"""Every command under one set of rules (issue 55): each declares what it reads and writes (`foco.cli.rules`), one
runner applies them, and this file walks every subcommand of the parser, so that a command added without rules
breaks the suite."""
from __future__ import annotations

import argparse
import json
import shutil
from fnmatch import fnmatch
from pathlib import Path

import pytest

from foco.cli import build_parser, main
from foco.cli.rules import commands, declare, enforce, problems
from foco.utils.ownership import MARKER, RUN_OUTPUTS


def _fails(argv, capsys, *needles) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    for n in needles:
        assert n in err, err
    return err


def test_every_command_of_the_parser_declares_its_rules():
    found = list(commands(build_parser()))
    assert len(found) >= 28  # the walk reaches every leaf, and `foco decompose`, which runs on its own
    assert ("decompose",) in [path for path, _ in found] and ("world", "oacir") in [path for path, _ in found]
    assert problems(build_parser()) == []


def test_a_command_added_without_rules_breaks_the_walk():
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    new = sub.add_parser("new-command")
    new.add_argument("--out")
    assert problems(p) == ["`foco new-command` declares no rules (foco.cli.rules.declare)"]
    declare(new, reads={})
    assert problems(p) == ["`foco new-command` does not declare --out: read (and of what kind), written, or a value"]
    new.add_argument("--world")
    declare(new, reads={"world": "world"}, files=("out",))
    assert problems(p) == []
    with pytest.raises(RuntimeError, match="declares no rules"):
        enforce(argparse.Namespace(command="new-command", func=lambda a: 0))


def test_a_declaration_of_an_unknown_kind_or_a_missing_flag_is_caught():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("c")
    with pytest.raises(ValueError, match="unknown read kinds"):
        declare(c, reads={"world": "a world"})
    declare(c, reads={"world": "world"})
    assert problems(p) == ["`foco c` declares 'world', which it has no flag for"]


def _user_folder(path: Path, *names: str) -> Path:
    path.mkdir(parents=True)
    for name in names or ("notes.txt",):
        (path / name).write_text("the user's own file\n")
    return path


def test_world_oacir_never_writes_into_a_users_folder(tiny_world, tmp_path, capsys):
    out = _user_folder(tmp_path / "mine", "queries.jsonl")
    _fails(["world", "oacir", "--world", tiny_world, "--out", out, "--splits", "test"], capsys,
           "--out", "foco did not write", "queries.jsonl", "--force")
    assert (out / "queries.jsonl").read_text() == "the user's own file\n" and not (out / MARKER).exists()


def test_an_oacir_protocol_is_never_written_into_another_worlds_folder(tiny_world, small_world, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(small_world / "world.json", other / "world.json")
    before = sorted(p.name for p in other.iterdir())
    _fails(["world", "oacir", "--world", tiny_world, "--out", other, "--splits", "test"], capsys,
           "--out", str(other), "made from world", "--world")
    assert sorted(p.name for p in other.iterdir()) == before


def test_the_owner_file_comes_before_the_first_file_so_a_killed_run_resumes(tiny_world, tmp_path, monkeypatch):
    import foco.benchmarks.export as export
    out = tmp_path / "export"
    argv = ["world", "export", "--world", str(tiny_world), "--format", "cirr", "--out", str(out)]
    written = export._Plan.run

    def killed(plan):  # the process dies after its first file: no handler, no `finally` runs
        path, data = plan.json[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[")
        raise RuntimeError("killed")
    monkeypatch.setattr(export._Plan, "run", killed)
    args = build_parser().parse_args(argv)
    enforce(args)  # what main does before the command
    with pytest.raises(RuntimeError, match="killed"):
        args.func(args)
    assert json.loads((out / MARKER).read_text())["kind"] == "world export"
    monkeypatch.setattr(export._Plan, "run", written)
    assert main(argv) == 0
    assert all(json.loads(p.read_text()) for p in out.rglob("*.json"))  # the torn file rewritten whole


def test_a_refused_command_leaves_no_folder_behind(tiny_world, tmp_path, capsys):
    out = tmp_path / "never"
    _fails(["world", "export", "--world", tmp_path / "no-world", "--format", "cirr", "--out", out], capsys)
    assert not out.exists()


def test_pact_and_tscir_refuse_an_edit_store_written_from_another_world(train_features, tiny_world, tmp_path,
                                                                         capsys):
    from foco.edits.rule import RuleWriter
    from foco.edits.run import GenerateConfig, run_generate
    from foco.edits.store import EditStore
    store = tmp_path / "e.sqlite"
    run_generate([], RuleWriter(), store, GenerateConfig(per_caption=1))
    with EditStore(store) as s:
        sid = next(iter(s.settings()))
        s.record_run(sid, {"world": "0123456789abcdef"})
    for command in (["pact", "train"], ["tscir", "train"]):
        _fails([*command, "--features", train_features, "--edits", store, "--out", tmp_path / command[0]], capsys,
               "--features", "--edits", str(store), "0123456789abcdef", "world")
        assert not (tmp_path / command[0]).exists()


def test_a_run_is_never_continued_on_another_worlds_data(tiny_world, small_world, tmp_path, capsys):
    out = tmp_path / "lincir"
    enforce(build_parser().parse_args(["lincir", "train", "--world", str(tiny_world), "--backbone", "world:vit",
                                       "--out", str(out)]))
    (out / "train_state").mkdir()  # the first run was stopped here
    err = _fails(["lincir", "train", "--world", small_world, "--backbone", "world:vit", "--out", out], capsys,
                 "--out", str(out), "made from world", "--world", "--restart")
    assert "mix two worlds" in err and (out / "train_state").is_dir()


def test_a_features_folder_that_mixes_worlds_is_refused(tiny_world, eval_features, small_world, tmp_path, capsys):
    feats = tmp_path / "feats"
    shutil.copytree(eval_features, feats)
    manifest = feats / "test-multi" / "manifest.json"
    meta = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**meta, "source": {**meta["source"], "world": "fedcba9876543210"}}))
    _fails(["eval", "--benchmark", "world", "--root", tiny_world, "--split", "test", "--features", feats,
            "--methods", "image"], capsys, "--features", "mixes", "test-multi", "fedcba9876543210")


def _weights_trained_on(path: Path, world: str, split: str) -> Path:
    path.mkdir()
    (path / "adafocal.json").write_text(json.dumps({"provenance": {"features": {
        "path": "x", "fingerprint": "y", "source": {"world": world, "split": split}}}}))
    return path


def test_weights_are_never_evaluated_on_the_split_they_were_trained_on(tiny_world, eval_features, tmp_path,
                                                                        capsys):
    from foco.world.generate import world_fingerprint
    fp = world_fingerprint(tiny_world)
    weights = _weights_trained_on(tmp_path / "ada", fp, "test/oacir")
    _fails(["eval", "--benchmark", "world", "--root", tiny_world, "--split", "test", "--features", eval_features,
            "--methods", "adafocal", "--adafocal", weights], capsys,
           "--adafocal", str(weights), "test/oacir", "--split test")
    # the same weights on the other split, or trained on another world's test, pass this rule
    from foco.cli.provenance import check_split_apart, inputs_of
    args = build_parser().parse_args(["eval", "--benchmark", "world", "--root", str(tiny_world), "--split", "val",
                                      "--methods", "adafocal", "--adafocal", str(weights)])
    check_split_apart(args, args._rules, inputs_of(args, args._rules))
    other = _weights_trained_on(tmp_path / "ada2", "0" * 16, "test/oacir")
    args = build_parser().parse_args(["eval", "--benchmark", "world", "--root", str(tiny_world), "--split", "test",
                                      "--methods", "adafocal", "--adafocal", str(other)])
    check_split_apart(args, args._rules, inputs_of(args, args._rules))


def test_restart_removes_only_what_the_trainer_wrote(tmp_path):
    from foco.train.loop import clear_run
    from foco.utils.ownership import enter_foreign
    out = _user_folder(tmp_path / "mine", "notes.txt", "foco.json")  # the user's, though named as foco's
    enter_foreign(out)
    (out / "train_state").mkdir()
    (out / "train_log.jsonl").write_text("{}\n")
    (out / "pic2word.safetensors").write_text("x")
    (out / "later.txt").write_text("the user's, added after foco entered\n")
    assert sorted(clear_run(out)) == ["pic2word.safetensors", "train_log.jsonl", "train_state"]
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "foco.json", "later.txt", "notes.txt"])


def test_a_trainer_restarted_in_a_users_folder_keeps_the_users_files(train_features, tmp_path, capsys):
    out = _user_folder(tmp_path / "mine", "notes.txt")
    argv = ["pic2word", "train", "--features", train_features, "--epochs", "1", "--batch-size", "256",
            "--out", out, "--force", "--device", "cpu"]
    assert main([str(a) for a in argv]) == 0
    assert main([str(a) for a in argv + ["--restart"]]) == 0
    assert (out / "notes.txt").read_text() == "the user's own file\n" and (out / "pic2word.json").is_file()
    assert "removed" in capsys.readouterr().err


def test_every_trainer_writes_only_what_a_restart_may_remove(trainer_runs):
    seen = 0
    trainers = {"FoCo checkpoint", "Pic2Word mapper", "LinCIR phi", "text composer (PACT, TSCIR)", "world backbone"}
    for run in sorted(p for p in trainer_runs.iterdir() if p.is_dir() and (p / MARKER).exists()
                      and json.loads((p / MARKER).read_text()).get("kind") in trainers):
        for entry in run.iterdir():
            if entry.name != MARKER:
                assert any(fnmatch(entry.name, pat) for pat in RUN_OUTPUTS), (run.name, entry.name)
        seen += 1
    assert seen >= 7


@pytest.fixture(scope="module")
def half_shard(tiny_world, tmp_path_factory):
    """The tiny world's training pairs as 3 webdataset shards, the second cut to half its bytes."""
    out = tmp_path_factory.mktemp("cut") / "shards"
    assert main(["world", "export", "--world", str(tiny_world), "--format", "webdataset", "--split", "train",
                 "--out", str(out), "--shard-size", "250"]) == 0
    cut = out / "00001.tar"
    data = cut.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    return str(out / "{00000..00002}.tar"), cut


@pytest.mark.parametrize("cut_at", ["half", "a header"])
def test_a_truncated_shard_is_an_error_naming_the_shard_and_the_byte_offset(half_shard, cut_at, tmp_path):
    from foco.corpora.loader import index_tar
    from foco.corpora.webdataset import iter_shard
    _, cut = half_shard
    shard = cut
    if cut_at == "a header":  # cut exactly between two members: tarfile reads it as a shorter, whole archive
        shard = tmp_path / "00001.tar"
        whole = index_tar(half_shard[1].parent / "00000.tar")
        end = whole[100].image.offset - 512  # the header of sample 100's image
        shard.write_bytes((half_shard[1].parent / "00000.tar").read_bytes()[:end])
    for read in (index_tar, lambda p: list(iter_shard(p, with_images=False))):
        with pytest.raises(Exception, match=r"00001\.tar.*(cut short|damaged).*byte offset \d+"):
            read(shard)


def test_features_extract_and_index_build_refuse_a_truncated_shard(half_shard, tmp_path, capsys):
    pattern, cut = half_shard
    _fails(["features", "extract", "--backbone", "world:pretrained", "--in", pattern, "--out", tmp_path / "f"],
           capsys, str(cut), "byte offset")
    _fails(["index", "build", "--in", pattern, "--backbone", "world:pretrained", "--out", tmp_path / "i"], capsys,
           str(cut), "byte offset")
    assert not (tmp_path / "i" / "index.json").exists()


def test_a_server_refuses_at_startup_a_method_the_index_cannot_answer(four_image_index, tmp_path, capsys):
    from foco import create_backbone
    from foco.methods.lincir import LinCIRConfig, LinCIRPhi
    from foco.search.engine import SearchEngine
    backbone = create_backbone("world:pretrained")
    phi = tmp_path / "phi"
    LinCIRPhi(LinCIRConfig(embed_dim=backbone.embed_dim, token_dim=backbone.token_dim)).save(
        phi, {"backbone": "world:pretrained"})
    engine = SearchEngine.open(four_image_index, lincir=phi)
    assert "lincir" not in engine.available_methods() and "sum" in engine.available_methods()
    assert "--lincir" in engine.refused["lincir"] and "raw embedding (its norm)" in engine.refused["lincir"]
    _fails(["search", "--index", four_image_index, "--reference", "0", "--text", "make it red", "--method",
            "lincir", "--lincir", phi], capsys, "refused on this index", "--lincir", "norm")


def test_verify_reads_the_ambiguous_variant_and_its_images(tiny_world, tmp_path, capsys):
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world)
    assert main(["world", "ambiguous", "--world", str(world), "--queries", "3"]) == 0
    assert main(["world", "verify", str(world)]) == 0
    assert "test-ambiguous/single" in capsys.readouterr().out
    images = sorted((world / "images" / "test-ambiguous-single").glob("*.png"))
    a, b = images[0].read_bytes(), images[1].read_bytes()
    images[0].write_bytes(b)
    images[1].write_bytes(a)
    assert main(["world", "verify", str(world)]) == 2
    assert images[0].name in capsys.readouterr().err
    images[0].write_bytes(a)
    images[1].write_bytes(b)
    # a record an older foco wrote (no hashes): its images are decoded, and verify passes
    record = world / "benchmarks" / "test-ambiguous" / "single" / "ambiguous.json"
    meta = json.loads(record.read_text())
    record.write_text(json.dumps({k: v for k, v in meta.items()
                                  if k not in ("images_sha256", "manifests_sha256", "record_sha256")}))
    assert main(["world", "verify", str(world)]) == 0, capsys.readouterr().err


# A review's findings (issue 55), each a regression test.

def test_only_rank_zero_writes_the_owner_file(tmp_path, monkeypatch, train_features):
    argv = ["pic2word", "train", "--features", str(train_features), "--out", str(tmp_path / "p")]
    monkeypatch.setenv("RANK", "1")
    enforce(build_parser().parse_args(argv))
    assert not (tmp_path / "p" / MARKER).exists()
    monkeypatch.setenv("RANK", "0")
    enforce(build_parser().parse_args(argv))
    assert (tmp_path / "p" / MARKER).is_file() and [p.name for p in (tmp_path / "p").iterdir()] == [MARKER]


def test_a_rewritten_world_is_continued_from_its_own_source(tiny_world, tmp_path):
    out = tmp_path / "w2"
    argv = ["edits", "rewrite", "--root", str(tiny_world), "--out", str(out)]
    enforce(build_parser().parse_args(argv))  # the first run: its inputs recorded
    meta = json.loads((tiny_world / "world.json").read_text())
    (out / "world.json").write_text(json.dumps({**meta, "rewritten_from": str(tiny_world)}))  # as rewrite writes
    enforce(build_parser().parse_args(argv))  # the rerun (another split) is not refused


def test_a_users_files_are_recorded_once_when_foco_first_enters(tmp_path):
    from foco.utils.ownership import enter_foreign, removable
    out = _user_folder(tmp_path / "mine", "notes.txt")
    enter_foreign(out)
    (out / "00000.tar").write_text("foco's shard")
    enter_foreign(out)  # a rerun with --force
    assert json.loads((out / MARKER).read_text())["user_files"] == ["notes.txt"]
    assert [p.name for p in removable(out, ("[0-9]*.tar",))] == ["00000.tar"]


def test_edit_features_may_lie_in_the_commands_own_out(train_features, tmp_path):
    out = tmp_path / "pact"
    enforce(build_parser().parse_args(["pact", "train", "--features", str(train_features), "--edits", "e.sqlite",
                                       "--out", str(out), "--edit-features", str(out / "edit-features")]))
    assert json.loads((out / "edit-features" / MARKER).read_text())["kind"] == "feature cache"


def test_the_trained_split_rule_reads_evals_default_split(tiny_world, tmp_path, capsys):
    from foco.world.generate import world_fingerprint
    weights = _weights_trained_on(tmp_path / "ada", world_fingerprint(tiny_world), "val/oacir")
    _fails(["eval", "--benchmark", "world", "--root", tiny_world, "--methods", "adafocal", "--adafocal", weights],
           capsys, "--adafocal", "val/oacir", "--split val")


def test_the_odd_world_out_is_the_one_named():
    from foco.cli.provenance import check_same_world
    inputs = {"--features": {"path": "f", "noun": "features", "worlds": ["a"]},
              "--world": {"path": "w", "noun": "the world", "worlds": ["a"]},
              "--edits": {"path": "e", "noun": "edit triplets", "worlds": ["b"]}}
    with pytest.raises(ValueError, match=r"^--edits e holds edit triplets of world b, another world than --features"):
        check_same_world(inputs)


def test_a_damaged_weights_record_is_left_to_its_reader(tmp_path):
    from foco.cli.provenance import READERS
    for bad in ({"provenance": "x"}, {"provenance": {"features": 3}}, [1, 2]):
        (tmp_path / "foco.json").write_text(json.dumps(bad))
        assert READERS["weights"](tmp_path) == {}
