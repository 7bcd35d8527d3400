"""Reliability (issue 13, durability): a full disk (RLIMIT_FSIZE, as a tiny tmpfs would), a read-only output folder
and a SIGKILL in the middle of a write. Each command stops with a message that names the file and the fix, leaves
no half-written file, and a rerun reaches exactly what an undisturbed run writes."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import _shared
from foco.cli import main

CHILD = """import os, resource, signal, sys
limit = int(os.environ.pop("FOCO_TEST_FSIZE", "0"))
if limit:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as ENOSPC on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from foco.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _foco(args, fsize: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, *map(str, args)],
                            env={**os.environ, "FOCO_TEST_FSIZE": str(fsize)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _run(args, **kw) -> subprocess.CompletedProcess:
    p = _foco(args, **kw)
    out, err = p.communicate(timeout=600)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _tensors(cache: Path) -> dict:
    from foco.features import FeatureCache
    fc = FeatureCache(cache)
    ids, im = fc.images()
    tids, tx = fc.texts()
    return {"ids": ids, "g": im.global_, "p": im.patches, "tids": tids, "t": tx.global_, "tok": tx.tokens}


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.tmp")]


# bf16 where this CPU has it natively (half the encoder's time); the same precision in every run of a test
EXTRACT = ["features", "extract", "--backbone", "world:pretrained", "--split", "train", "--shard-size", "32",
           "--precision", "auto"]


@pytest.fixture(scope="session")
def clean_train_cache(small_world, tmp_path_factory):
    """An uninterrupted extraction of the 192-pair world's train split, built once per run (`conftest._shared`): the
    reference that interrupted ones must equal."""

    def build(root):
        r = _run([*EXTRACT, "--world", small_world, "--out", root / "feats"])
        assert r.returncode == 0, r.stderr
    return _tensors(_shared(tmp_path_factory, "clean-train-cache", build) / "feats")


@pytest.mark.slow
def test_a_full_disk_stops_extraction_cleanly_and_a_rerun_completes_it(small_world, clean_train_cache, tmp_path):
    out = tmp_path / "feats"
    r = _run([*EXTRACT, "--world", small_world, "--out", out], fsize=200_000)  # a shard of patches is ~1 MB
    assert r.returncode == 2, r.stderr
    assert "cannot write" in r.stderr and "shard-00000.safetensors" in r.stderr and "Traceback" not in r.stderr
    assert "rerun the same command" in r.stderr
    assert _leftovers(out) == []
    r = _run([*EXTRACT, "--world", small_world, "--out", out])
    assert r.returncode == 0, r.stderr
    assert _same(_tensors(out), clean_train_cache)


@pytest.mark.slow
def test_a_full_disk_during_decomposition_keeps_the_store_and_resumes(tmp_path):
    from foco.decompose.store import DecompositionStore
    captions = tmp_path / "captions.csv"
    texts = [f"a brown dog number {i} sits on a red sofa" for i in range(1500)]
    captions.write_text("id,caption\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
    store = tmp_path / "store.sqlite"
    args = ["decompose", "--in", captions, "--decomposer", "rule", "--out", store, "--batch-size", "100"]
    r = _run(args, fsize=120_000)
    assert r.returncode == 2, r.stderr
    assert f"cannot write {store}" in r.stderr and "rolled back" in r.stderr and "Traceback" not in r.stderr
    with DecompositionStore(store) as st:
        kept = st.count()
    assert 0 < kept < 1500
    r = _run(args)
    assert r.returncode == 0, r.stderr
    clean = tmp_path / "clean.sqlite"
    assert _run([*args[:-3], clean, "--batch-size", "100"]).returncode == 0
    with DecompositionStore(store) as a, DecompositionStore(clean) as b:
        sid = next(iter(a.settings()))
        assert a.count() == b.count() == 1500
        assert {k: v.to_dict() for k, v in a.get_many(sid, texts).items()} == \
            {k: v.to_dict() for k, v in b.get_many(sid, texts).items()}


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write into. Root ignores permission bits, so as root it is a read-only tmpfs
    mount (or, where mounting is not allowed, an immutable folder); otherwise a folder with mode 0555."""
    ro = tmp_path / "ro"
    ro.mkdir()
    undo = None
    if os.geteuid() != 0:
        ro.chmod(0o555)
        undo = ["chmod", "755", str(ro)]
    elif subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                        capture_output=True).returncode == 0:
        undo = ["umount", str(ro)]
    elif subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode == 0:
        undo = ["chattr", "-i", str(ro)]
    else:
        pytest.skip("as root, neither a read-only mount nor chattr +i is allowed here")
    yield ro
    subprocess.run(undo, check=True)


@pytest.mark.parametrize("command", ["world", "decompose"])
def test_a_read_only_output_folder_is_named_with_the_fix(read_only_folder, tmp_path, command):
    ro = read_only_folder
    captions = tmp_path / "captions.csv"
    captions.write_text("id,caption\n1,a red square on a blue background\n")
    args = {"world": ["world", "generate", "--out", ro / "w", "--size", "tiny"],
            "decompose": ["decompose", "--in", captions, "--decomposer", "rule", "--out", ro / "s.sqlite"]}[command]
    r = _run(args)
    assert r.returncode == 2, r.stderr
    assert str(ro) in r.stderr and ("not writable" in r.stderr or "read-only" in r.stderr), r.stderr
    assert "Traceback" not in r.stderr and "choose a writable --out" in r.stderr
    assert list(ro.iterdir()) == []


def _writing_commands(world, feats, ro):
    """Every command that writes an output folder, pointed at one in `ro` (issue 42 item 5)."""
    return {
        "features extract": ["features", "extract", "--world", world, "--split", "test/single", "--backbone",
                             "world:pretrained", "--out", ro / "f"],
        "train": ["train", "--features", feats, "--world", world, "--out", ro / "t"],
        "index build": ["index", "build", "--images", world / "images" / "test-single", "--backbone",
                        "world:pretrained", "--out", ro / "i"],
        "pic2word train": ["pic2word", "train", "--features", feats, "--out", ro / "p"],
        "lincir train": ["lincir", "train", "--world", world, "--backbone", "world:pretrained", "--out", ro / "l"],
        "searle oti": ["searle", "oti", "--features", feats, "--out", ro / "so"],
        "context-i2w train": ["context-i2w", "train", "--features", feats, "--world", world, "--out", ro / "c"],
        "backbone train": ["backbone", "train", "--world", world, "--out", ro / "b"],
        "edits generate": ["edits", "generate", "--in", world, "--out", ro / "e.sqlite"],
        "quickstart": ["quickstart", "--out", ro / "q", "--size", "tiny"],
        "world generate": ["world", "generate", "--out", ro / "w", "--size", "tiny"],
        "eval --out": ["eval", "--benchmark", "world", "--root", world, "--split", "test", "--methods", "sum",
                       "--out", ro / "r.json"],
    }


def test_every_writing_command_refuses_a_read_only_output_before_any_work(read_only_folder, tiny_world,
                                                                         train_features, capsys):
    """Each names the output and the flag that fixes it, with no traceback, and writes nothing."""
    for name, args in _writing_commands(tiny_world, train_features, read_only_folder).items():
        code = main([str(a) for a in args])
        err = capsys.readouterr().err
        assert code == 2, (name, err)
        assert str(read_only_folder) in err and "Traceback" not in err, (name, err)
        assert "read-only" in err or "not writable" in err, (name, err)
        assert "choose a writable --out" in err or "choose another --out" in err, (name, err)
    assert list(read_only_folder.iterdir()) == []


@pytest.mark.slow
def test_sigkill_during_extraction_resumes_to_identical_shards(small_world, clean_train_cache, tmp_path):
    out = tmp_path / "feats"
    p = _foco([*EXTRACT, "--world", small_world, "--out", out])
    marker = out / "texts" / "shard-00001.json"
    deadline = time.time() + 300
    while not marker.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    assert p.returncode == -signal.SIGKILL, "the extraction finished before it could be killed"
    # it was stopped mid-way (27 text shards of 32; 12 shards after the marker are the 384 texts that 3 shards of
    # 128 were before the shards were cut to 32: the same margin against a kill that lands late)
    assert not (out / "texts" / "shard-00013.json").exists()
    r = _run([*EXTRACT, "--world", small_world, "--out", out])
    assert r.returncode == 0, r.stderr
    assert _same(_tensors(out), clean_train_cache)
    assert _leftovers(out) == []
