"""Shared fixtures and the suite's run rules.

- **Parallel.** `make test` runs pytest-xdist on every core (`-n auto`). Each worker limits torch, and every process
  it starts (OMP_NUM_THREADS), to its share of the cores, so that two workers do not fight over two cores.
- **Built once per run.** The session fixtures below (the tiny world, its encoded splits, the edit table, the
  four-image index) are built by the first worker that needs them, under a file lock in the run's shared temporary
  folder, and read by the others (`_shared`); docs/benchmarks.md "The suite" has the measurement that chose this
  over one build per worker. `FOCO_TEST_SHARED=worker` builds them in every worker instead.
- **Isolated.** Each test gets the environment variables, working folder and torch's thread count it started
  with: a test that changes any of them cannot change its neighbours'. A shared fixture's folder is fingerprinted
  when it is built and checked when the worker ends, so a test that writes into one fails the run instead of
  another test.
- **Order.** The `slow` tests go first (`--order slow-first`, the default), so that the workers start the long
  end-to-end runs early and fill the end with short tests instead of one worker finishing a long test alone.
  `--order given`, `--order reverse` or `--order shuffle --order-seed N` run the tests in another order: no result
  may depend on it.
"""
import json
import os
import random
import shutil
import socket
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _worker_threads() -> int | None:
    """Under xdist: this worker's share of the cores (at least 1); None when pytest runs in one process."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(workers))


_THREADS = _worker_threads()
if _THREADS is not None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # inherited by every process a test starts
        os.environ[var] = str(_THREADS)
    import torch
    torch.set_num_threads(_THREADS)


def pytest_configure(config):
    """xdist's load scheduling sends a worker up to half the queue at once, so one worker can end with a queue of
    long tests while the other idles (measured: 132 % of two cores, docs/benchmarks.md "The suite"); two at a time
    keeps both busy to the end, with the slow tests first."""
    if hasattr(config.option, "maxschedchunk") and config.option.maxschedchunk is None:
        config.option.maxschedchunk = 2


def pytest_addoption(parser):
    parser.addoption("--order", choices=("slow-first", "given", "reverse", "shuffle"), default="slow-first",
                     help="run the collected tests in this order: the slow ones first (default; the workers' time "
                          "evens out), as collected, reversed, or shuffled (checks that no result depends on it)")
    parser.addoption("--order-seed", type=int, default=0, help="the seed of --order shuffle")


def pytest_collection_modifyitems(config, items):
    order = config.getoption("--order")
    if order == "slow-first":  # a stable sort: the given order within each group
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    elif order == "reverse":
        items.reverse()
    elif order == "shuffle":
        random.Random(config.getoption("--order-seed")).shuffle(items)


@pytest.fixture(autouse=True)
def _isolated_process_state():
    """Every test starts with the environment, working folder and torch thread count of the worker, whatever the one
    before did."""
    import torch
    env, cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    yield
    if os.getcwd() != cwd:
        os.chdir(cwd)
    if dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _run_root(tmp_path_factory) -> Path:
    """The folder every worker of this run shares: the parent of the workers' own temporary folders under xdist,
    pytest's own temporary folder without it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def free_port(tmp_path_factory):
    """`free_port()`: a loopback port no other test of this run has been given. The kernel picks a free one; the
    run records it under a file lock, so two workers starting servers at once never get the same port."""
    from filelock import FileLock
    record = _run_root(tmp_path_factory) / "ports.json"

    def take() -> int:
        with FileLock(str(record) + ".lock"):
            taken = set(json.loads(record.read_text())) if record.exists() else set()
            while True:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                if port not in taken:
                    break
            record.write_text(json.dumps(sorted(taken | {port})))
        return port
    return take


def _fingerprint(folder: Path) -> list:
    """Names, sizes and modification times of everything under `folder`: what a test writing into it changes."""
    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_dir() or p.name.endswith(_SQLITE_SIDE_FILES):
            continue
        st = p.lstat()
        out.append([str(p.relative_to(folder)), st.st_size, st.st_mtime_ns])
    return out


_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")  # a reader of a WAL database makes and removes them


_BUILT: dict[Path, list] = {}


def _shared(tmp_path_factory, name: str, build) -> Path:
    """The folder `name`, built by `build(folder)` once per run: under xdist by the first worker that asks, under a
    file lock, and read by the others; in its own temporary folder without xdist (or with FOCO_TEST_SHARED=worker).
    A build that fails leaves no half-built folder for the next worker to trust."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("FOCO_TEST_SHARED") == "worker":
        out = tmp_path_factory.mktemp(name)
        build(out)
        _BUILT[out] = _fingerprint(out)
        return out
    from filelock import FileLock
    root = _run_root(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            if out.exists():
                shutil.rmtree(out)
            out.mkdir()
            build(out)
            done.write_text(json.dumps(_fingerprint(out)))
    _BUILT[out] = json.loads(done.read_text())
    return out


@pytest.fixture(scope="session", autouse=True)
def _shared_folders_unchanged():
    """Fails the run (an error at the worker's last teardown) when a test wrote into a shared fixture's folder."""
    yield
    changed = [str(p) for p, fp in _BUILT.items() if p.exists() and _fingerprint(p) != fp]
    assert not changed, f"a test wrote into a shared fixture's folder, which every test must only read: {changed}"


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The `tiny` world, generated once per run through the CLI."""
    from foco.cli import main

    def build(out):
        assert main(["world", "generate", "--out", str(out / "tiny"), "--size", "tiny"]) == 0
    return _shared(tmp_path_factory, "world", build) / "tiny"


@pytest.fixture(scope="session")
def small_world(tmp_path_factory):
    """A 192-pair world (`trainer_runs.SMALL_WORLD`): the smallest the commands run end to end on, for tests whose
    point is a path, not an amount of data; generated once per run, read-only."""

    def build(out):
        from trainer_runs import generate_small_world
        generate_small_world(out / "small")
    return _shared(tmp_path_factory, "small-world", build) / "small"


@pytest.fixture(scope="session")
def train_features(tiny_world, tmp_path_factory):
    """The tiny world's training split encoded once per run by a small random world backbone, in fp32 (bf16 would
    halve the frozen text encoder's time, about 4 s here, but rounds differently on each CPU kind: every test that
    trains on these features would then depend on the machine)."""

    def build(root):
        from trainer_runs import build_train_features
        build_train_features(tiny_world, root)
    return _shared(tmp_path_factory, "train-feats", build) / "f"


@pytest.fixture(scope="session")
def trainer_runs(tiny_world, small_world, train_features, tmp_path_factory):
    """Every trainer's tiny run from the CLI (tests/trainer_runs.py), once per run: `<root>/<name>` as each
    command wrote it, and `found.json`, the tensors foco's code made without their device during the runs' epochs.
    The goldens test hashes them; tests that need one of these trained checkpoints read it (read-only: copy it to
    continue it)."""

    def build(root):
        from trainer_runs import run_every_trainer, write_json
        write_json(root / "found.json", run_every_trainer(tiny_world, train_features, root, small_world))
    return _shared(tmp_path_factory, "trainer-runs", build)


def _edits(tiny_world, train_features, tmp_path_factory, name: str, sources: int | None, per_caption: int):
    """Rule-written edits of the tiny world's first `sources` training captions (None: all), their texts encoded
    once per run; the table is joined in each worker."""
    from foco.edits.store import EditStore
    from foco.train.edit_data import build_edit_table

    def build(root):
        from foco import create_backbone
        from foco.decompose.inputs import read_captions
        from foco.edits.rule import RuleWriter
        from foco.edits.run import GenerateConfig, run_generate
        from foco.features import ExtractConfig, FeatureCache
        from foco.train.edit_data import encode_edit_texts
        captions = [(r.id, r.truth) for r in read_captions(tiny_world, split="train")][:sources]
        stats = run_generate(captions, RuleWriter(), root / "e.sqlite", GenerateConfig(per_caption=per_caption))
        with EditStore(root / "e.sqlite") as store:
            records = store.records(stats.settings_id)
        backbone = create_backbone(FeatureCache(train_features).manifest["backbone"])
        encode_edit_texts(backbone, records, root / "texts", cfg=ExtractConfig(precision="auto"))
        (root / "settings.json").write_text(json.dumps({"settings_id": stats.settings_id}))
    root = _shared(tmp_path_factory, name, build)
    with EditStore(root / "e.sqlite") as store:
        records = store.records(json.loads((root / "settings.json").read_text())["settings_id"])
    return build_edit_table(train_features, root / "texts", records)


@pytest.fixture(scope="session")
def edit_table(tiny_world, train_features, tmp_path_factory):
    """Rule-written edits of the tiny world's training split (2 per caption, 1,200), for tests that train on them."""
    return _edits(tiny_world, train_features, tmp_path_factory, "edits", None, 2)


@pytest.fixture(scope="session")
def small_edit_table(tiny_world, train_features, tmp_path_factory):
    """Edits of the first 64 training captions (1 each): for tests of a path, not of learning."""
    return _edits(tiny_world, train_features, tmp_path_factory, "small-edits", 64, 1)


@pytest.fixture(scope="session")
def eval_features(tiny_world, train_features, tmp_path_factory):
    """test/single and test/multi of the tiny world, encoded with the training features' backbone."""

    def build(root):
        from foco import create_backbone
        from foco.features import FeatureCache
        from foco.world.splits import extract_world_split
        backbone = create_backbone(FeatureCache(train_features).manifest["backbone"])
        for protocol in ("single", "multi"):
            extract_world_split(backbone, tiny_world, f"test/{protocol}", root / f"test-{protocol}")
    return _shared(tmp_path_factory, "eval-feats", build)


@pytest.fixture(scope="session")
def four_image_index(tiny_world, tmp_path_factory):
    """An index of 4 of the tiny world's images with world:pretrained, built once per run; open it read-only."""

    def build(root):
        from foco.search.build import IndexConfig, build_index
        (root / "imgs").mkdir()
        for p in sorted((tiny_world / "images").rglob("*.png"))[:4]:
            shutil.copy(p, root / "imgs" / p.name)
        build_index(IndexConfig(images=str(root / "imgs"), backbone="world:pretrained"), root / "idx")
    return _shared(tmp_path_factory, "four-image-index", build) / "idx"


@pytest.fixture(scope="session")
def corpus(tiny_world, tmp_path_factory):
    """The tiny world's train split as 4 webdataset shards, their rule decompositions and fp32 features: built once
    per run (`conftest._shared`), read-only."""

    def build(root):
        from foco.cli import main
        assert main(["world", "export", "--world", str(tiny_world), "--format", "webdataset", "--split", "train",
                     "--out", str(root / "shards"), "--shard-size", "150"]) == 0
        pattern = str(root / "shards" / "{00000..00003}.tar")
        assert main(["decompose", "--in", pattern, "--decomposer", "rule", "--out", str(root / "d.sqlite")]) == 0
        assert main(["features", "extract", "--backbone", "world:pretrained", "--in", pattern, "--out",
                     str(root / "f"), "--decompositions", str(root / "d.sqlite"), "--decomposer", "rule", "--dtype",
                     "float32", "--device", "cpu"]) == 0
    root = _shared(tmp_path_factory, "online-corpus", build)
    return root, str(root / "shards" / "{00000..00003}.tar"), root / "d.sqlite", root / "f"
