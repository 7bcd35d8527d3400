"""Issue 55's probe: an independent set of cases, one per input a user can give, written from the issue's classes of
failure across every command (`experiments/probe_rules_table.py` tabulates them):

- A. ownership and data loss: a command writing into a folder it does not own, a --restart removing a user's files,
  an output of one kind written into another kind's folder;
- B. resume: a command killed midway resumes on rerun (the kill is real: the command runs in a forked child that
  is SIGKILLed once its output folder holds its first files);
- C. provenance: every input pair shares its backbone, world, split and feature cache;
- D. integrity: what a world, a protocol or a webdataset shard holds is checked on read;
- E. bounds: a count that sizes memory, processes or time is refused, naming its flag, before any work;
- F. text parsed by hand: boxes, templates, shards, split lists and a user's own `*`;
- G. serving: a listed method never answers a query with a 500.

Each case asserts the correct behaviour: a refusal (exit 2, `foco: error:` or argparse's `error: argument --flag`,
naming the flag, file or field), or the exact right result with nothing the user owned lost. Each case carries the
class of failure it would show (`probe`), and a failing case records the one it showed (`probe_observed`, a junit
property): a user's file or foco's good output gone or changed is "data loss"; a traceback, an exception, an exit
code other than 0 or 2, a hang past the case's timeout or a memory limit hit is "unhandled"; exit 0 where a refusal
was expected, or a wrong result, is "silently wrong"; a refusal where the command should have worked, or one that
names nothing the user can act on, counts as the case's own class.

Every command runs in this process (`foco.cli.main`), under a guard: a timeout (SIGALRM), an address-space limit
(a few GB above what the process holds) and a cap on the processes it may start, so that a count that is not
refused fails its case instead of the machine. Nothing here writes into a shared fixture's folder.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from foco.cli import main

CLASSES = {"A": "ownership and data loss", "B": "resume", "C": "provenance", "D": "integrity", "E": "bounds",
           "F": "text parsed by hand", "G": "serving"}
LABELS = ("data loss", "unhandled", "silently wrong")


# --- labelling ------------------------------------------------------------------------------------------------------

def probe(cls: str, label: str):
    """The class of the issue a case belongs to and the class of failure it would show."""
    assert cls in CLASSES and label in LABELS, (cls, label)

    def mark(f):
        f.probe = (cls, label)
        return f
    return mark


@dataclass(frozen=True)
class Case:
    """One parametrized case: its id, class, label and whatever the test needs."""
    id: str
    cls: str
    label: str
    data: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        assert self.cls in CLASSES and self.label in LABELS, self


def cases(*items: Case):
    return pytest.mark.parametrize("case", items, ids=[c.id for c in items])


_NOW: dict = {}


@pytest.fixture(autouse=True)
def _probe_record(request, record_property):
    case = getattr(getattr(request.node, "callspec", None), "params", {}).get("case")
    cls, label = (case.cls, case.label) if isinstance(case, Case) else request.node.function.probe
    record_property("probe_class", cls)
    record_property("probe_label", label)
    _NOW.update(record=record_property, label=label)
    yield
    _NOW.clear()


def fail(observed: str, message: str):
    assert observed in LABELS
    _NOW["record"]("probe_observed", observed)
    pytest.fail(f"[{observed}] {message}", pytrace=False)


# --- running a command under a guard --------------------------------------------------------------------------------

class Hang(BaseException):
    """The command ran past its case's timeout."""


class TooManyProcesses(BaseException):
    """The command started more processes than any tiny input needs."""


@contextlib.contextmanager
def guard(seconds: float, extra_mb: int = 4096, processes: int = 16):
    def on_alarm(signum, frame):
        raise Hang(f"still running after {seconds:g} s")
    import multiprocessing.process as mpp
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (vm + extra_mb * 2 ** 20, hard))
    start, started = mpp.BaseProcess.start, [0]

    def counted(self):
        started[0] += 1
        if started[0] > processes:
            raise TooManyProcesses(f"the command started more than {processes} processes")
        return start(self)
    mpp.BaseProcess.start = counted
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        mpp.BaseProcess.start = start


def _after_fork() -> None:
    """In a forked child: torch on one thread, and no thread pool of the parent's that the child lacks the thread
    of (foco's batch reader is a process-wide pool; a child submitting to the parent's would wait forever)."""
    torch.set_num_threads(1)
    import foco.train.data as data
    data._READER.clear()


@dataclass
class Res:
    code: int | None
    out: str
    err: str
    exc: BaseException | None
    seconds: float

    def show(self) -> str:
        what = f"exit {self.code}" if self.exc is None else f"{type(self.exc).__name__}: {str(self.exc)[:300]}"
        return f"{what} after {self.seconds:.1f} s; stderr: {self.err[-700:]!r}"


def cli(argv, capsys, timeout: float = 60.0, extra_mb: int = 4096) -> Res:
    """`foco.cli.main(argv)` under `guard`: its exit code (argparse's SystemExit included), output and exception."""
    capsys.readouterr()
    t0, code, exc = time.monotonic(), None, None
    try:
        with guard(timeout, extra_mb):
            code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - every other exception is the finding
        exc = e
    cap = capsys.readouterr()
    return Res(code, cap.out, cap.err, exc, time.monotonic() - t0)


def cli_forked(argv, timeout: float = 10.0, extra_mb: int = 1024) -> Res:
    """`cli` in a forked child (torch on one thread): a command that hangs inside C code, or allocates without end,
    is SIGKILLed after `timeout` seconds (a Hang), its address space capped `extra_mb` above the parent's."""
    import select
    t0 = time.monotonic()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            _after_fork()
            out, err, code, exc = io.StringIO(), io.StringIO(), None, None
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), guard(timeout, extra_mb):
                    code = main([str(a) for a in argv])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException as e:  # noqa: BLE001
                exc = f"{type(e).__name__}: {str(e)[:500]}"
            data = json.dumps({"code": code, "out": out.getvalue()[-4000:], "err": err.getvalue()[-4000:],
                               "exc": exc}).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], t0 + timeout + 0.5
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    seconds = time.monotonic() - t0
    if not chunks:
        return Res(None, "", "", Hang(f"killed after {seconds:.1f} s (no answer)"), seconds)
    got = json.loads(b"".join(chunks))
    exc = None
    if got["exc"]:
        kind = got["exc"].split(":", 1)[0]
        exc = (Hang if kind == "Hang" else TooManyProcesses if kind == "TooManyProcesses" else RuntimeError)(got["exc"])
    return Res(got["code"], got["out"], got["err"], exc, seconds)


# --- judging --------------------------------------------------------------------------------------------------------

def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Keep:
    """Files (a user's, or foco's good output) that must come through a command unchanged."""

    def __init__(self, *paths):
        self.files: dict[Path, str] = {}
        for p in map(Path, paths):
            for f in ([p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())):
                self.files[f] = _sha(f)
        assert self.files, paths

    def lost(self) -> list[str]:
        return [str(f) for f, h in self.files.items() if not f.is_file() or _sha(f) != h]


def _common(res: Res, keep) -> None:
    lost = [x for k in keep for x in k.lost()]
    if lost:
        fail("data loss", f"removed or changed: {lost[:5]}; {res.show()}")
    if res.exc is not None or res.code not in (0, 2) or "Traceback (most recent call last)" in res.err:
        fail("unhandled", res.show())


def refused(res: Res, *needles, keep=(), absent=()) -> None:
    """Exit 2 with a one-line error naming each needle (a string, or a tuple of alternatives); every `keep`
    unchanged; no path of `absent` written."""
    _common(res, keep)
    if res.code == 0:
        fail("silently wrong", f"exit 0 where a refusal was expected; stdout: {res.out[-400:]!r}")
    if "error" not in res.err:
        fail(_NOW["label"], f"exit 2 without an error message: {res.show()}")
    missing = [n for n in needles if not any(a in res.err for a in ((n,) if isinstance(n, str) else n))]
    if missing:
        fail(_NOW["label"], f"refused without naming {missing}: {res.show()}")
    written = [str(p) for p in absent if Path(p).exists()]
    if written:
        fail(_NOW["label"], f"refused, but only after writing {written}")


def succeeded(res: Res, keep=()) -> None:
    """Exit 0, every `keep` unchanged."""
    _common(res, keep)
    if res.code != 0:
        fail(_NOW["label"], f"refused where it should have run: {res.show()}")


def check(ok: bool, message: str, observed: str | None = None) -> None:
    if not ok:
        fail(observed or _NOW["label"], message)


def tree(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of the files under `folder`, less the owner file and hidden temporary files (what a
    killed atomic write leaves is litter, not data)."""
    return {p.relative_to(folder).as_posix(): _sha(p) for p in sorted(Path(folder).rglob("*"))
            if p.is_file() and p.name != ".foco-owner.json" and not (p.name.startswith(".") and ".tmp" in p.name)}


def same_tree(got: Path, want: Path) -> None:
    a, b = tree(got), tree(want)
    extra, missing = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    check(not (extra or missing or changed), f"{got} differs from a fresh run's {want}: extra {extra[:4]}, missing "
          f"{missing[:4]}, changed {changed[:4]}", "silently wrong")


# --- inputs ---------------------------------------------------------------------------------------------------------

def user_folder(path: Path, name: str = "notes.txt", body: str = "the user's own file\n") -> Path:
    (path / name).parent.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(body)
    return path


def world_copy(src: Path, dst: Path, seed_shift: int = 0) -> Path:
    """A world's manifests copied, its images linked folder by folder (a command that adds an images/<name> folder
    writes it into the copy, never into `src`); `seed_shift`: another world with the same files (world.json's seed
    moved)."""
    src = Path(src)
    shutil.copytree(src, dst, ignore=lambda d, names: ["images"] if Path(d) == src else [], symlinks=True)
    (dst / "images").mkdir()
    for sub in sorted((src / "images").iterdir()):
        (dst / "images" / sub.name).symlink_to(sub.resolve(), target_is_directory=sub.is_dir())
    if seed_shift:
        summary = json.loads((dst / "world.json").read_text())
        summary["config"]["seed"] += seed_shift
        (dst / "world.json").write_text(json.dumps(summary))
    return dst


def user_db(path: Path) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as c:
        c.execute("CREATE TABLE users (name TEXT)")
        c.execute("INSERT INTO users VALUES ('ada')")
        c.commit()
    return path


def silent(argv) -> None:
    """A setup command that must work."""
    import contextlib as cl
    with cl.redirect_stdout(io.StringIO()):
        assert main([str(a) for a in argv]) == 0, argv


PRE = "world:pretrained"


@pytest.fixture(scope="module")
def pre(tiny_world, tmp_path_factory):
    """An index of six of the tiny world's test images on world:pretrained, and a weights folder of every served
    method made for that backbone (untrained: these cases test paths, not retrieval)."""
    from foco.methods.adafocal import AdaFocalConfig, AdaFocalModel
    from foco.methods.lincir import LinCIRConfig, LinCIRPhi
    from foco.methods.pic2word import Pic2WordConfig, Pic2WordMapper
    from foco.model import ComposedQueryEncoder, FoCoConfig
    from foco.model.caam import CAAMConfig
    from foco.search.build import IndexConfig, build_index
    root = tmp_path_factory.mktemp("probe-rules-pre")
    (root / "imgs").mkdir()
    for p in sorted((tiny_world / "images" / "test-single").glob("*.png"))[:6]:
        shutil.copy(p, root / "imgs" / p.name)
    build_index(IndexConfig(images=str(root / "imgs"), backbone=PRE, workers=0), root / "idx")
    meta = {"backbone": PRE}
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256)).save(root / "foco", meta)
    Pic2WordMapper(Pic2WordConfig(image_dim=256, token_dim=384, hidden_dim=16)).save(root / "p2w_raw", meta)
    Pic2WordMapper(Pic2WordConfig(image_dim=256, token_dim=384, hidden_dim=16, mapper_input="normalized")).save(
        root / "p2w_norm", meta)
    LinCIRPhi(LinCIRConfig(embed_dim=256, token_dim=384, hidden_ratio=1)).save(root / "lincir", meta)
    AdaFocalModel(AdaFocalConfig(foco=FoCoConfig(dim=256), caam=CAAMConfig(dim=256))).save(root / "ada", meta)
    return root


@pytest.fixture(scope="module")
def oac(tiny_world, tmp_path_factory):
    """A copy of the tiny world with OACIR train and test (8 queries each), their features on world:pretrained
    (f/train-oacir, f/test-oacir) and an AdaFocal trained on train (ada)."""
    root = tmp_path_factory.mktemp("probe-rules-oacir")
    w = world_copy(tiny_world, root / "w")
    silent(["world", "oacir", "--world", w, "--splits", "train,test", "--queries", "8"])
    for s in ("train", "test"):
        silent(["features", "extract", "--backbone", PRE, "--world", w, "--split", f"{s}/oacir", "--out",
                root / "f" / f"{s}-oacir", "--device", "cpu"])
    silent(["adafocal", "train", "--features", root / "f", "--world", w, "--split", "train", "--out", root / "ada",
            "--max-steps", "1", "--batch-size", "8", "--device", "cpu"])
    return root


@pytest.fixture(scope="module")
def stores(tiny_world, small_world, tmp_path_factory):
    """Edit stores of 16 training captions of the tiny world (e.sqlite) and of another world (e_other.sqlite: the
    small world's sizes drawn with another seed, so that its train-000000... are other pictures under other
    captions), that world itself (other/), its oracle decompositions (d_other.sqlite) and a CSV of captions."""
    from foco.world.generate import generate_world, world_config
    from trainer_runs import SMALL_WORLD
    root = tmp_path_factory.mktemp("probe-rules-stores")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        generate_world(root / "other", world_config("tiny", seed=7, **SMALL_WORLD))
    silent(["edits", "generate", "--in", tiny_world, "--out", root / "e.sqlite", "--limit", "16"])
    silent(["edits", "generate", "--in", root / "other", "--out", root / "e_other.sqlite", "--limit", "16"])
    silent(["decompose", "--in", root / "other", "--out", root / "d_other.sqlite"])
    (root / "c.csv").write_text("id,caption\n1,a red square on a beach\n2,a blue circle next to a tree\n")
    return root


@pytest.fixture(scope="module")
def shards(small_world, tmp_path_factory):
    """The small world's 192 training pairs as 3 webdataset shards (s/), their features on world:pretrained (f/)
    and an index of them built from those features (idx/)."""
    root = tmp_path_factory.mktemp("probe-rules-shards")
    silent(["world", "export", "--world", small_world, "--format", "webdataset", "--split", "train", "--out",
            root / "s", "--shard-size", "64"])
    pattern = str(root / "s" / "{00000..00002}.tar")
    silent(["features", "extract", "--backbone", PRE, "--in", pattern, "--out", root / "f", "--device", "cpu",
            "--workers", "0"])
    silent(["index", "build", "--in", pattern, "--features", root / "f", "--backbone", PRE, "--out", root / "idx",
            "--device", "cpu", "--workers", "0"])
    return root, pattern


def _shards_copy(shards, dst: Path) -> str:
    root, _ = shards
    shutil.copytree(root / "s", dst)
    return str(dst / "{00000..00002}.tar")


def _truncate(path: Path) -> int:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return len(data) // 2


@pytest.fixture(scope="module")
def bb_spec(train_features):
    from foco.features import FeatureCache
    return FeatureCache(train_features).manifest["backbone"]


@pytest.fixture(scope="module")
def p2w_bb(train_features, bb_spec, tmp_path_factory):
    """A Pic2Word mapper (untrained) for the training features' backbone, as `eval --pic2word` reads it."""
    from foco.features import FeatureCache
    from foco.methods.pic2word import Pic2WordConfig, Pic2WordMapper
    dim = int(FeatureCache(train_features).manifest["embed_dim"])
    root = tmp_path_factory.mktemp("probe-rules-p2w")
    torch.manual_seed(0)
    Pic2WordMapper(Pic2WordConfig(image_dim=dim, token_dim=384, hidden_dim=16, mapper_input="normalized")).save(
        root / "p2w", {"backbone": bb_spec})
    return root / "p2w"


# ====================================================================================================================
# A. Ownership and data loss
# ====================================================================================================================

@probe("A", "silently wrong")
def test_A_world_oacir_refuses_a_users_folder(tiny_world, tmp_path, capsys):
    folder = user_folder(tmp_path / "mine")
    keep = Keep(folder)
    res = cli(["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "2", "--out", folder], capsys)
    refused(res, ("--out", str(folder)), keep=[keep], absent=[folder / "benchmarks"])


@probe("A", "data loss")
def test_A_world_oacir_never_replaces_a_users_file_of_an_output_name(tiny_world, tmp_path, capsys):
    folder = user_folder(tmp_path / "mine", "benchmarks/test/oacir/queries.jsonl", '{"my": "annotations"}\n')
    keep = Keep(folder)
    res = cli(["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "2", "--out", folder], capsys)
    refused(res, ("--out", str(folder)), keep=[keep])


@probe("A", "silently wrong")
def test_A_world_oacir_refuses_a_foco_checkpoint_folder(tiny_world, tmp_path, capsys):
    from foco.model import ComposedQueryEncoder, FoCoConfig
    ComposedQueryEncoder(FoCoConfig(dim=32)).save(tmp_path / "ck", {"backbone": PRE})
    keep = Keep(tmp_path / "ck")
    res = cli(["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "2", "--out", tmp_path / "ck"],
              capsys)
    refused(res, ("FoCo checkpoint", "foco did not write"), keep=[keep], absent=[tmp_path / "ck" / "benchmarks"])


@probe("A", "silently wrong")
def test_A_world_oacir_refuses_a_feature_cache(tiny_world, train_features, tmp_path, capsys):
    cache = tmp_path / "c"
    shutil.copytree(train_features, cache)
    keep = Keep(cache)
    res = cli(["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "2", "--out", cache], capsys)
    refused(res, "feature cache", keep=[keep], absent=[cache / "benchmarks"])


def _restart_argv(name: str, fx: dict, out: Path) -> list:
    f, w, s = (lambda: fx["train_features"]), (lambda: fx["tiny_world"]), (lambda: fx["small_world"])
    build = {
        "train": lambda: ["train", "--features", f(), "--world", w(), "--out", out, "--stage1-epochs", "1",
                          "--stage2-epochs", "0", "--batch-size", "128", "--device", "cpu"],
        "pic2word": lambda: ["pic2word", "train", "--features", f(), "--out", out, "--epochs", "1", "--batch-size",
                             "256", "--device", "cpu"],
        "lincir": lambda: ["lincir", "train", "--world", s(), "--split", "pretrain", "--backbone", fx["bb_spec"],
                           "--out", out, "--epochs", "1", "--batch-size", "8", "--device", "cpu"],
        "backbone": lambda: ["backbone", "train", "--world", s(), "--out", out, "--epochs", "1", "--batch-size", "8",
                             "--device", "cpu"],
        "adafocal": lambda: ["adafocal", "train", "--features", fx["oac"] / "f", "--world", fx["oac"] / "w",
                             "--split", "train", "--out", out, "--max-steps", "1", "--batch-size", "8", "--device",
                             "cpu"],
        "pact": lambda: ["pact", "train", "--features", f(), "--edits", fx["stores"] / "e.sqlite", "--out", out,
                         "--max-steps", "1", "--batch-size", "8", "--device", "cpu"],
        "tscir": lambda: ["tscir", "train", "--features", f(), "--edits", fx["stores"] / "e.sqlite", "--out", out,
                          "--max-steps", "1", "--batch-size", "8", "--device", "cpu"],
        "context-i2w": lambda: ["context-i2w", "train", "--features", f(), "--world", w(), "--out", out, "--epochs",
                                "1", "--batch-size", "256", "--device", "cpu"],
        "searle-oti": lambda: ["searle", "oti", "--features", f(), "--out", out, "--images", "4", "--oti-steps", "1",
                               "--batch-size", "4", "--device", "cpu"],
    }
    return build[name]()


_RESTART_NEEDS = {"train": ("train_features", "tiny_world"), "pic2word": ("train_features",),
                  "lincir": ("small_world", "bb_spec"), "backbone": ("small_world",), "adafocal": ("oac",),
                  "pact": ("train_features", "stores"), "tscir": ("train_features", "stores"),
                  "context-i2w": ("train_features", "tiny_world"), "searle-oti": ("train_features",)}


def _fx(request, names) -> dict:
    return {n: request.getfixturevalue(n) for n in names}


@cases(*[Case(f"{t}", "A", "data loss", {"trainer": t}) for t in _RESTART_NEEDS])
def test_A_restart_in_a_folder_entered_with_force_keeps_the_users_files(case, request, tmp_path, capsys):
    """A user's folder entered with --force (it stays the user's: every later command needs --force again) and
    --restart: the restart removes a run, never the user's files beside it."""
    fx = _fx(request, _RESTART_NEEDS[case.data["trainer"]])
    folder = user_folder(tmp_path / "mine")
    keep = Keep(folder / "notes.txt")
    argv = _restart_argv(case.data["trainer"], fx, folder)
    succeeded(cli([*argv, "--force", "--restart"], capsys), keep=[keep])


@probe("A", "data loss")
def test_A_restart_of_a_foco_run_keeps_a_file_the_user_put_beside_it(train_features, tiny_world, tmp_path, capsys):
    out = tmp_path / "foco"
    argv = ["train", "--features", train_features, "--world", tiny_world, "--out", out, "--stage1-epochs", "1",
            "--stage2-epochs", "0", "--batch-size", "128", "--device", "cpu"]
    succeeded(cli(argv, capsys))
    user_folder(out, "my-notes.md", "why I trained this\n")
    keep = Keep(out / "my-notes.md")
    succeeded(cli([*argv, "--restart"], capsys), keep=[keep])


@probe("A", "data loss")
def test_A_lincir_restart_never_clears_a_pic2word_folder(small_world, bb_spec, pre, tmp_path, capsys):
    out = tmp_path / "p2w"
    shutil.copytree(pre / "p2w_norm", out)
    keep = Keep(out / "pic2word.json", out / "pic2word.safetensors")
    res = cli(["lincir", "train", "--world", small_world, "--split", "pretrain", "--backbone", bb_spec, "--out", out,
               "--epochs", "1", "--batch-size", "8", "--device", "cpu", "--restart", "--force"], capsys)
    refused(res, "Pic2Word", keep=[keep])


@probe("A", "silently wrong")
def test_A_adafocal_refuses_a_foco_checkpoint_folder(oac, tmp_path, capsys):
    from foco.model import ComposedQueryEncoder, FoCoConfig
    ComposedQueryEncoder(FoCoConfig(dim=256)).save(tmp_path / "ck", {"backbone": PRE})
    keep = Keep(tmp_path / "ck")
    res = cli(["adafocal", "train", "--features", oac / "f", "--world", oac / "w", "--split", "train", "--out",
               tmp_path / "ck", "--max-steps", "1", "--batch-size", "8", "--device", "cpu"], capsys)
    refused(res, ("FoCo checkpoint", "foco did not write"), keep=[keep], absent=[tmp_path / "ck" / "adafocal.json"])


@cases(*[Case(f"{cmd}-{what}", "A", label, {"cmd": cmd, "files": files})
         for cmd in ("pact", "tscir", "foco-edits")
         for what, label, files in (("beside-notes", "silently wrong", ("notes.txt",)),
                                    ("same-name-manifest", "data loss", ("manifest.json", "notes.txt")))])
def test_A_edit_features_refuses_a_users_folder(case, train_features, tiny_world, stores, tmp_path, capsys):
    """--edit-features names a folder the command writes a feature cache into: a user's folder (holding notes, or
    a manifest.json of their own) is refused like any --out, naming it, and nothing is written there."""
    folder = tmp_path / "mine"
    for name in case.data["files"]:
        user_folder(folder, name, '{"my": "manifest"}\n' if name.endswith(".json") else "the user's own file\n")
    keep = Keep(folder)
    common = ["--features", train_features, "--edits", stores / "e.sqlite", "--edit-features", folder, "--out",
              tmp_path / "o", "--device", "cpu"]
    argv = {"pact": ["pact", "train", *common, "--max-steps", "1", "--batch-size", "8"],
            "tscir": ["tscir", "train", *common, "--max-steps", "1", "--batch-size", "8"],
            "foco-edits": ["train", *common, "--world", tiny_world, "--stage1-epochs", "0", "--stage2-epochs", "0",
                           "--stage3-epochs", "1", "--batch-size", "128"]}[case.data["cmd"]]
    refused(cli(argv, capsys), ("--edit-features", str(folder)), keep=[keep])
    check(sorted(p.name for p in folder.iterdir()) == sorted(case.data["files"]),
          f"wrote into {folder}: {sorted(p.name for p in folder.iterdir())}")


@probe("A", "silently wrong")
def test_A_eval_cache_refuses_a_users_folder(tiny_world, tmp_path, capsys):
    from foco.benchmarks.export import export_world
    export_world(tiny_world, "cirr", "val", tmp_path / "cirr")
    folder = user_folder(tmp_path / "mine")
    keep = Keep(folder)
    res = cli(["eval", "--benchmark", "cirr", "--root", tmp_path / "cirr", "--split", "val", "--backbone", PRE,
               "--methods", "sum", "--cache", folder, "--device", "cpu"], capsys)
    refused(res, "--cache", keep=[keep])
    check(sorted(p.name for p in folder.iterdir()) == ["notes.txt"], f"wrote into {folder}: "
          f"{sorted(p.name for p in folder.iterdir())}")


@probe("A", "data loss")
def test_A_eval_out_never_replaces_a_checkpoint_record(tiny_world, eval_features, train_features, tmp_path, capsys):
    from foco.features import FeatureCache
    from foco.model import ComposedQueryEncoder, FoCoConfig
    spec = FeatureCache(train_features).manifest["backbone"]
    dim = int(FeatureCache(train_features).manifest["embed_dim"])
    ComposedQueryEncoder(FoCoConfig(dim=dim)).save(tmp_path / "ck", {"backbone": spec})
    keep = Keep(tmp_path / "ck")
    res = cli(["eval", "--benchmark", "world", "--root", tiny_world, "--split", "test", "--features", eval_features,
               "--methods", "sum", "--out", tmp_path / "ck" / "foco.json", "--device", "cpu"], capsys)
    refused(res, ("foco.json", "--out"), keep=[keep])


@probe("A", "data loss")
def test_A_decompose_merge_refuses_an_edit_store(stores, tmp_path, capsys):
    edits = tmp_path / "e.sqlite"
    shutil.copy(stores / "e.sqlite", edits)
    keep = Keep(edits)
    res = cli(["decompose", "merge", "--out", edits, stores / "d_other.sqlite"], capsys)
    refused(res, "edit store", keep=[keep])


@probe("A", "data loss")
def test_A_decompose_merge_refuses_another_applications_database(stores, tmp_path, capsys):
    db = user_db(tmp_path / "app.db")
    keep = Keep(db)
    refused(cli(["decompose", "merge", "--out", db, stores / "d_other.sqlite"], capsys), "users", keep=[keep])


@probe("A", "data loss")
def test_A_edits_generate_refuses_another_applications_database(tiny_world, tmp_path, capsys):
    db = user_db(tmp_path / "app.db")
    keep = Keep(db)
    refused(cli(["edits", "generate", "--in", tiny_world, "--out", db, "--limit", "2"], capsys), "users", keep=[keep])


@probe("A", "silently wrong")
def test_A_an_index_is_not_written_inside_a_world(tiny_world, pre, tmp_path, capsys):
    w = world_copy(tiny_world, tmp_path / "w")
    res = cli(["index", "build", "--images", pre / "imgs", "--backbone", PRE, "--out", w / "idx", "--device", "cpu",
               "--workers", "0"], capsys)
    refused(res, "world", absent=[w / "idx"])


@cases(Case("describe-beside", "A", "silently wrong", {"cmd": "describe", "name": "notes.txt"}),
       Case("describe-same-name", "A", "data loss", {"cmd": "describe", "name": "queries.jsonl"}),
       Case("restage-beside", "A", "silently wrong", {"cmd": "restage", "name": "notes.txt"}),
       Case("restage-same-name", "A", "data loss", {"cmd": "restage", "name": "gallery.jsonl"}))
def test_A_protocols_refuse_a_users_files_in_their_folder_without_force(case, tiny_world, tmp_path, capsys):
    """`world describe` / `world restage` document --force as what lets them write beside (or over) files in
    benchmarks/SPLIT/<protocol> that foco did not write: without it, such a folder is refused."""
    w = world_copy(tiny_world, tmp_path / "w")
    protocol = {"describe": "described", "restage": "restaged"}[case.data["cmd"]]
    folder = user_folder(w / "benchmarks" / "val" / protocol, case.data["name"], "the user's own file\n")
    keep = Keep(folder)
    argv = ["world", case.data["cmd"], "--world", w, "--share", "0.5", "--split", "val"]
    if case.data["cmd"] == "restage":
        argv += ["--strength", "0.2"]
    refused(cli(argv, capsys), ("--force", str(folder)), keep=[keep])


@probe("A", "silently wrong")
def test_A_oacirr_export_refuses_a_users_folder(oac, tmp_path, capsys):
    folder = user_folder(tmp_path / "mine")
    keep = Keep(folder)
    res = cli(["world", "export", "--world", oac / "w", "--format", "oacirr", "--split", "test", "--out", folder],
              capsys)
    refused(res, "--force", keep=[keep])
    check(sorted(p.name for p in folder.iterdir()) == ["notes.txt"], "wrote into the user's folder")


@probe("A", "silently wrong")
def test_A_features_extract_refuses_a_webdataset_export(small_world, tmp_path, capsys):
    silent(["world", "export", "--world", small_world, "--format", "webdataset", "--split", "train", "--out",
            tmp_path / "s", "--shard-size", "100"])
    keep = Keep(tmp_path / "s")
    res = cli(["features", "extract", "--backbone", PRE, "--world", small_world, "--split", "train", "--out",
               tmp_path / "s", "--device", "cpu"], capsys)
    refused(res, "world export", keep=[keep], absent=[tmp_path / "s" / "manifest.json"])


# ====================================================================================================================
# B. Resume: a command SIGKILLed midway resumes on rerun
# ====================================================================================================================

def killed(argv, watch: Path, n_files: int, timeout: float = 60.0) -> int | str:
    """Runs `main(argv)` in a forked child, SIGKILLed (os._exit(137), no cleanup of any kind) as soon as `watch`
    holds `n_files` files: what a killed command leaves. Returns the child's exit code (137: killed)."""
    import faulthandler
    stacks = Path(watch).parent / f".{Path(watch).name}.child-stacks.txt"
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            _after_fork()
            faulthandler.dump_traceback_later(timeout - 2, exit=True, file=open(stacks, "w"))

            def written() -> int:
                try:
                    return sum(1 for p in Path(watch).rglob("*") if p.is_file() and p.name != ".foco-owner.json") \
                        if Path(watch).exists() else 0
                except OSError:
                    return 0

            def poll():
                while True:
                    if written() >= n_files:
                        os._exit(137)
                    time.sleep(0.001)
            threading.Thread(target=poll, daemon=True).start()
            # and at every file the command opens or moves into place after that: the kill lands midway however
            # fast the command runs (a poll alone can miss a command that finishes within a millisecond)
            import builtins
            real_open, real_replace = builtins.open, os.replace

            def guarded_open(*args, **kwargs):
                if written() >= n_files:
                    os._exit(137)
                return real_open(*args, **kwargs)

            def guarded_replace(*args, **kwargs):
                if written() >= n_files:
                    os._exit(137)
                return real_replace(*args, **kwargs)
            builtins.open, os.replace = guarded_open, guarded_replace
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
                main([str(a) for a in argv])
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
        finally:
            os._exit(3)
    t0 = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout" + (f"; the child's stacks:\n{stacks.read_text()[-3000:]}" if stacks.exists() else "")
        time.sleep(0.005)


def kill_then_rerun(argv, watch: Path, n_files: int, capsys) -> Res:
    code = killed(argv, watch, n_files)
    assert code == 137, f"the setup did not kill the command midway (child exit {code}); lower n_files"
    return cli(argv, capsys)


@probe("B", "silently wrong")
def test_B_features_extract_killed_resumes(tiny_world, tmp_path, capsys):
    out = tmp_path / "f"
    argv = ["features", "extract", "--backbone", PRE, "--world", tiny_world, "--split", "val/single", "--out", out,
            "--shard-size", "32", "--device", "cpu"]
    res = kill_then_rerun(argv, out, 3, capsys)
    succeeded(res)
    verify = cli(["features", "verify", "--cache", out], capsys)
    check(verify.code == 0, f"the resumed cache fails verify: {verify.out[-400:]}")
    from foco.features import FeatureCache
    check(len(FeatureCache(out).ids("images")) == 248, "the resumed cache does not hold the 248 gallery images")


@probe("B", "silently wrong")
def test_B_webdataset_export_killed_resumes_to_whole_shards(small_world, tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["world", "export", "--world", small_world, "--format", "webdataset", "--split", "train", "--out", out,
            "--shard-size", "64"]
    succeeded(kill_then_rerun(argv, out, 1, capsys))
    silent(["world", "export", "--world", small_world, "--format", "webdataset", "--split", "train", "--out",
            tmp_path / "fresh", "--shard-size", "64"])
    same_tree(out, tmp_path / "fresh")


@probe("B", "silently wrong")
def test_B_cirr_export_killed_resumes(tiny_world, tmp_path, capsys):
    out = tmp_path / "cirr"
    argv = ["world", "export", "--world", tiny_world, "--format", "cirr", "--split", "val", "--out", out]
    succeeded(kill_then_rerun(argv, out, 2, capsys))
    silent([*argv[:-1], tmp_path / "fresh"])
    same_tree(out, tmp_path / "fresh")


@probe("B", "silently wrong")
def test_B_world_ambiguous_killed_resumes(tiny_world, tmp_path, capsys):
    out = tmp_path / "amb"
    argv = ["world", "ambiguous", "--world", tiny_world, "--queries", "6", "--out", out]
    succeeded(kill_then_rerun(argv, out, 2, capsys))
    silent([*argv[:-1], tmp_path / "fresh"])
    same_tree(out, tmp_path / "fresh")


@probe("B", "silently wrong")
def test_B_world_oacir_killed_resumes(tiny_world, tmp_path, capsys):
    out = tmp_path / "oa"
    argv = ["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "6", "--out", out]
    succeeded(kill_then_rerun(argv, out, 3, capsys))
    silent([*argv[:-1], tmp_path / "fresh"])
    same_tree(out, tmp_path / "fresh")


@probe("B", "silently wrong")
def test_B_index_build_killed_resumes(pre, tmp_path, capsys):
    out = tmp_path / "idx"
    argv = ["index", "build", "--images", pre / "imgs", "--backbone", PRE, "--out", out, "--device", "cpu",
            "--workers", "0"]
    succeeded(kill_then_rerun(argv, out, 1, capsys))
    from foco.search.engine import SearchEngine
    check(SearchEngine.open(out).count() == 6, "the resumed index does not hold the 6 images")


@probe("B", "silently wrong")
def test_B_shard_index_build_killed_resumes(shards, tmp_path, capsys):
    root, pattern = shards
    out = tmp_path / "idx"
    argv = ["index", "build", "--in", pattern, "--features", root / "f", "--backbone", PRE, "--out", out, "--device",
            "cpu", "--workers", "0"]
    succeeded(kill_then_rerun(argv, out, 1, capsys))
    from foco.search.engine import SearchEngine
    check(SearchEngine.open(out).count() == 192, "the resumed index does not hold the 192 samples")


@probe("B", "silently wrong")
def test_B_features_extract_of_shards_killed_resumes(shards, tmp_path, capsys):
    _, pattern = shards
    out = tmp_path / "f"
    argv = ["features", "extract", "--backbone", PRE, "--in", pattern, "--out", out, "--device", "cpu", "--workers",
            "0"]
    succeeded(kill_then_rerun(argv, out, 2, capsys))
    silent(["features", "extract", "--backbone", PRE, "--in", pattern, "--out", tmp_path / "fresh", "--device", "cpu",
            "--workers", "0"])
    a, b = tree(out), tree(tmp_path / "fresh")
    check(sorted(a) == sorted(b), f"the resumed corpus lists other files than a fresh one: {sorted(set(a) ^ set(b))}")


@probe("B", "silently wrong")
def test_B_edits_rewrite_killed_resumes(tiny_world, tmp_path, capsys):
    out = tmp_path / "rw"
    argv = ["edits", "rewrite", "--root", tiny_world, "--split", "val", "--out", out]
    succeeded(kill_then_rerun(argv, out, 2, capsys))
    silent([*argv[:-1], tmp_path / "fresh"])
    same_tree(out, tmp_path / "fresh")


@probe("B", "silently wrong")
def test_B_decompose_killed_resumes(small_world, tmp_path, capsys):
    out = tmp_path / "d"
    argv = ["decompose", "--in", small_world, "--out", out / "d.sqlite", "--batch-size", "16"]
    out.mkdir()
    succeeded(kill_then_rerun(argv, out, 1, capsys))
    from foco.decompose import DecompositionStore
    with DecompositionStore(out / "d.sqlite") as store:
        check(len(store.done_hashes(store.resolve("oracle"))) == 192, "the resumed store lacks captions")


@probe("B", "silently wrong")
def test_B_foco_train_killed_resumes(train_features, tiny_world, tmp_path, capsys):
    out = tmp_path / "foco"
    argv = ["train", "--features", train_features, "--world", tiny_world, "--out", out, "--stage1-epochs", "2",
            "--stage2-epochs", "1", "--batch-size", "128", "--device", "cpu"]
    succeeded(kill_then_rerun(argv, out, 1, capsys))
    check((out / "foco.json").is_file(), "the resumed run saved no checkpoint")


@probe("B", "silently wrong")
def test_B_world_describe_killed_resumes(tiny_world, tmp_path, capsys):
    w = world_copy(tiny_world, tmp_path / "w")
    argv = ["world", "describe", "--world", w, "--share", "0.5", "--split", "val"]
    succeeded(kill_then_rerun(argv, w / "benchmarks" / "val" / "described", 1, capsys))
    check(cli(["world", "verify", w], capsys).code == 0, "the resumed world fails verify")


@probe("B", "silently wrong")
def test_B_world_restage_killed_resumes(tiny_world, tmp_path, capsys):
    w = world_copy(tiny_world, tmp_path / "w")
    argv = ["world", "restage", "--world", w, "--strength", "0.3", "--share", "0.5", "--split", "val"]
    succeeded(kill_then_rerun(argv, w / "benchmarks" / "val" / "restaged", 4, capsys))
    v = cli(["world", "verify", w], capsys)
    check(v.code == 0, f"the resumed world fails verify: {v.show()}")


@probe("B", "silently wrong")
def test_B_oacirr_export_killed_resumes(oac, tmp_path, capsys):
    out = tmp_path / "x"
    argv = ["world", "export", "--world", oac / "w", "--format", "oacirr", "--split", "test", "--out", out]
    succeeded(kill_then_rerun(argv, out, 2, capsys))
    silent([*argv[:-1], tmp_path / "fresh"])
    same_tree(out, tmp_path / "fresh")


# ====================================================================================================================
# C. Provenance: every input pair shares backbone, world, split and feature cache
# ====================================================================================================================

@cases(Case("pact", "C", "silently wrong", {"cmd": "pact"}), Case("tscir", "C", "silently wrong", {"cmd": "tscir"}),
       Case("foco-edits", "C", "silently wrong", {"cmd": "train"}))
def test_C_an_edit_store_of_another_world_is_refused(case, train_features, tiny_world, stores, tmp_path, capsys):
    """The features are the tiny world's training split; the edit store was written from another world's captions
    (the same ids, other pictures): its triplets describe other images."""
    common = ["--features", train_features, "--edits", stores / "e_other.sqlite", "--out", tmp_path / "o",
              "--device", "cpu"]
    argv = {"pact": ["pact", "train", *common, "--max-steps", "1", "--batch-size", "8"],
            "tscir": ["tscir", "train", *common, "--max-steps", "1", "--batch-size", "8"],
            "train": ["train", *common, "--world", tiny_world, "--stage1-epochs", "0", "--stage2-epochs", "0",
                      "--stage3-epochs", "1", "--batch-size", "128"]}[case.data["cmd"]]
    refused(cli(argv, capsys), "--edits")


@probe("C", "silently wrong")
def test_C_lincir_resumed_with_another_world_is_refused(small_world, bb_spec, stores, tmp_path, capsys):
    other = stores / "other"  # the same split sizes, other captions
    base = ["lincir", "train", "--split", "pretrain", "--backbone", bb_spec, "--out", tmp_path / "o", "--epochs", "1",
            "--batch-size", "8", "--device", "cpu"]
    succeeded(cli([*base, "--world", small_world], capsys))
    refused(cli([*base, "--world", other, "--epochs", "2", "--allow-changed", "epochs"], capsys), "--world")


@probe("C", "silently wrong")
def test_C_pic2word_resumed_on_another_feature_cache_is_refused(train_features, tmp_path, capsys):
    """The second cache holds as many images, extracted (its manifest says) from another world."""
    other = tmp_path / "other"
    shutil.copytree(train_features, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["source"]["world"] = "0123456789abcdef"
    (other / "manifest.json").write_text(json.dumps(manifest, indent=2))
    base = ["pic2word", "train", "--out", tmp_path / "o", "--batch-size", "256", "--device", "cpu"]
    succeeded(cli([*base, "--features", train_features, "--epochs", "1"], capsys))
    refused(cli([*base, "--features", other, "--epochs", "2", "--allow-changed", "epochs"], capsys), "--features")


@probe("C", "silently wrong")
def test_C_pact_resumed_with_another_edit_store_is_refused(train_features, stores, tmp_path, capsys):
    base = ["pact", "train", "--features", train_features, "--out", tmp_path / "o", "--batch-size", "8", "--device",
            "cpu"]
    succeeded(cli([*base, "--edits", stores / "e.sqlite", "--max-steps", "1"], capsys))
    refused(cli([*base, "--edits", stores / "e_other.sqlite", "--max-steps", "2", "--allow-changed", "max-steps"],
                capsys), ("--edits", "edit-features"))


@probe("C", "silently wrong")
def test_C_adafocal_trained_on_test_is_not_evaluated_on_test(oac, tmp_path, capsys):
    out = tmp_path / "ada-test"
    succeeded(cli(["adafocal", "train", "--features", oac / "f", "--world", oac / "w", "--split", "test", "--out", out,
                   "--max-steps", "1", "--batch-size", "8", "--device", "cpu"], capsys))
    res = cli(["eval", "--benchmark", "world", "--root", oac / "w", "--split", "test", "--features", oac / "f",
               "--protocols", "oacir", "--methods", "adafocal", "--adafocal", out, "--device", "cpu"], capsys)
    refused(res, ("--adafocal", "--split"), ("test",))


@probe("C", "silently wrong")
def test_C_adafocal_trained_on_train_is_evaluated_on_test(oac, capsys):
    """The control of the case above: a model trained on train evaluated on test is fine."""
    res = cli(["eval", "--benchmark", "world", "--root", oac / "w", "--split", "test", "--features", oac / "f",
               "--protocols", "oacir", "--methods", "adafocal", "--adafocal", oac / "ada", "--device", "cpu"], capsys)
    succeeded(res)


@probe("C", "silently wrong")
def test_C_pic2word_trained_on_the_test_gallery_is_not_evaluated_on_test(tiny_world, eval_features, tmp_path,
                                                                         capsys):
    out = tmp_path / "p2w"
    succeeded(cli(["pic2word", "train", "--features", eval_features / "test-single", "--out", out, "--epochs", "1",
                   "--batch-size", "256", "--mapper-input", "normalized", "--device", "cpu"], capsys))
    res = cli(["eval", "--benchmark", "world", "--root", tiny_world, "--split", "test", "--features", eval_features,
               "--protocols", "single", "--methods", "pic2word", "--pic2word", out, "--device", "cpu"], capsys)
    refused(res, ("--pic2word", "--split"), ("test",))


@probe("C", "silently wrong")
def test_C_world_oacir_refuses_a_root_holding_another_worlds_protocol(tiny_world, tmp_path, capsys):
    other = world_copy(tiny_world, tmp_path / "w2", seed_shift=1)
    out = tmp_path / "oa"
    succeeded(cli(["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "4", "--out", out],
                  capsys))
    keep = Keep(out)
    res = cli(["world", "oacir", "--world", other, "--splits", "test", "--queries", "4", "--out", out], capsys)
    refused(res, ("--world", "--out"), keep=[keep])


@probe("C", "data loss")
def test_C_world_oacir_refuses_to_write_into_another_world(tiny_world, small_world, tmp_path, capsys):
    target = world_copy(small_world, tmp_path / "small")
    keep = Keep(target / "world.json", target / "benchmarks")
    res = cli(["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "4", "--out", target], capsys)
    refused(res, ("--out", "--world"), keep=[keep], absent=[target / "benchmarks" / "test" / "oacir"])


def _oacir_of_other_world(oac: Path, dst: Path) -> Path:
    """Another world (the same files, another seed) whose test/oacir protocol was copied from `oac`'s world."""
    return world_copy(oac / "w", dst, seed_shift=1)


@probe("C", "silently wrong")
def test_C_features_extract_refuses_an_oacir_protocol_of_another_world(oac, tmp_path, capsys):
    w2 = _oacir_of_other_world(oac, tmp_path / "w2")
    res = cli(["features", "extract", "--backbone", PRE, "--world", w2, "--split", "test/oacir", "--out",
               tmp_path / "f", "--device", "cpu"], capsys)
    refused(res, "oacir")


@probe("C", "silently wrong")
def test_C_adafocal_refuses_features_of_another_world(oac, tmp_path, capsys):
    w2 = _oacir_of_other_world(oac, tmp_path / "w2")
    res = cli(["adafocal", "train", "--features", oac / "f", "--world", w2, "--split", "train", "--out",
               tmp_path / "o", "--max-steps", "1", "--batch-size", "8", "--device", "cpu"], capsys)
    refused(res, ("--world", "holds features of world"), absent=[tmp_path / "o" / "adafocal.json"])


@probe("C", "silently wrong")
def test_C_eval_oacir_refuses_features_of_another_world(oac, tmp_path, capsys):
    w2 = _oacir_of_other_world(oac, tmp_path / "w2")
    res = cli(["eval", "--benchmark", "world", "--root", w2, "--split", "test", "--features", oac / "f",
               "--protocols", "oacir", "--methods", "adafocal", "--adafocal", oac / "ada", "--device", "cpu"], capsys)
    refused(res, "--root")


@probe("C", "silently wrong")
def test_C_tscir_refuses_features_of_another_world(train_features, tiny_world, stores, tmp_path, capsys):
    other = world_copy(tiny_world, tmp_path / "w2", seed_shift=1)
    res = cli(["tscir", "train", "--features", train_features, "--edits", stores / "e.sqlite", "--world", other,
               "--out", tmp_path / "o", "--max-steps", "1", "--batch-size", "8", "--device", "cpu"], capsys)
    refused(res, "--world")


@probe("C", "silently wrong")
def test_C_tscir_refuses_features_of_another_split(train_features, tiny_world, stores, tmp_path, capsys):
    res = cli(["tscir", "train", "--features", train_features, "--edits", stores / "e.sqlite", "--world", tiny_world,
               "--split", "pretrain", "--out", tmp_path / "o", "--max-steps", "1", "--batch-size", "8", "--device",
               "cpu"], capsys)
    refused(res, "--split")


@probe("C", "silently wrong")
def test_C_train_refuses_decompositions_of_another_world(train_features, tiny_world, stores, tmp_path, capsys):
    res = cli(["train", "--features", train_features, "--world", tiny_world, "--decompositions",
               stores / "d_other.sqlite", "--out", tmp_path / "o", "--stage1-epochs", "1", "--stage2-epochs", "0",
               "--batch-size", "128", "--device", "cpu"], capsys)
    refused(res, ("--decompositions", str(stores / "d_other.sqlite")), absent=[tmp_path / "o" / "foco.json"])


@probe("C", "silently wrong")
def test_C_index_build_refuses_features_of_other_shards(shards, small_world, tmp_path, capsys):
    """--features were extracted from the small world's training shards; --in names its pretrain split's."""
    root, _ = shards
    silent(["world", "export", "--world", small_world, "--format", "webdataset", "--split", "backbone_val", "--out",
            tmp_path / "s2", "--shard-size", "64"])
    pattern = str(tmp_path / "s2" / "00000.tar")
    res = cli(["index", "build", "--in", pattern, "--features", root / "f", "--backbone", PRE, "--out",
               tmp_path / "idx", "--device", "cpu", "--workers", "0"], capsys)
    refused(res, "--features")


@probe("C", "silently wrong")
def test_C_eval_refuses_test_features_under_a_val_name(tiny_world, eval_features, tmp_path, capsys):
    feats = tmp_path / "feats"
    feats.mkdir()
    (feats / "val-single").symlink_to(eval_features / "test-single", target_is_directory=True)
    res = cli(["eval", "--benchmark", "world", "--root", tiny_world, "--split", "val", "--features", feats,
               "--protocols", "single", "--methods", "sum", "--device", "cpu"], capsys)
    refused(res, ("split", "val-single"))


@probe("C", "silently wrong")
def test_C_ablate_refuses_features_of_another_world(tiny_world, train_features, eval_features, tmp_path, capsys):
    other = world_copy(tiny_world, tmp_path / "w2", seed_shift=1)
    feats = tmp_path / "feats"
    feats.mkdir()
    (feats / "train").symlink_to(train_features, target_is_directory=True)
    for p in ("single", "multi"):
        (feats / f"test-{p}").symlink_to(eval_features / f"test-{p}", target_is_directory=True)
    res = cli(["ablate", "--world", other, "--features", feats, "--out", tmp_path / "ab", "--split", "test",
               "--variants", "full", "--size", "tiny", "--max-steps", "1", "--batch-size", "64", "--device", "cpu"],
              capsys, timeout=60)
    refused(res, ("--world", "holds features of world"))


# ====================================================================================================================
# D. Integrity: what a world, a protocol or a shard holds is checked on read
# ====================================================================================================================

def _oacir_world(oac: Path, dst: Path) -> Path:
    return world_copy(oac / "w", dst)


def _swap(a: Path, b: Path) -> None:
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


def _oacir_images(w: Path, split: str = "test") -> list[Path]:
    return sorted((w / "benchmarks" / split / "oacir" / "images").glob("*.png"))


@probe("D", "silently wrong")
def test_D_world_verify_catches_swapped_oacir_images(oac, tmp_path, capsys):
    w = _oacir_world(oac, tmp_path / "w")
    a, b = _oacir_images(w)[:2]
    _swap(a, b)
    res = cli(["world", "verify", w], capsys)
    refused(res, (a.name, b.name))


@probe("D", "silently wrong")
def test_D_world_verify_catches_an_edited_oacir_box(oac, tmp_path, capsys):
    w = _oacir_world(oac, tmp_path / "w")
    path = w / "benchmarks" / "test" / "oacir" / "queries.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    rec = json.loads(lines[0])
    rec["box"] = [0.0, 0.0, 8.0, 8.0]
    path.write_text(json.dumps(rec) + "\n" + "".join(lines[1:]))
    refused(cli(["world", "verify", w], capsys), "queries.jsonl")


@probe("D", "silently wrong")
def test_D_world_verify_catches_an_edited_oacir_record(oac, tmp_path, capsys):
    w = _oacir_world(oac, tmp_path / "w")
    path = w / "benchmarks" / "test" / "oacir" / "oacir.json"
    rec = json.loads(path.read_text())
    rec["image_size"] = 2 * rec["image_size"]  # every box would be read at half its size
    path.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    refused(cli(["world", "verify", w], capsys), "oacir.json")


@probe("D", "silently wrong")
def test_D_an_edited_oacir_record_is_refused_by_its_readers(oac, tmp_path, capsys):
    w = _oacir_world(oac, tmp_path / "w")
    path = w / "benchmarks" / "test" / "oacir" / "oacir.json"
    rec = json.loads(path.read_text())
    rec["image_size"] = 2 * rec["image_size"]
    path.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    res = cli(["eval", "--benchmark", "world", "--root", w, "--split", "test", "--features", oac / "f",
               "--protocols", "oacir", "--methods", "adafocal", "--adafocal", oac / "ada", "--device", "cpu"], capsys)
    refused(res, "oacir.json")


@probe("D", "silently wrong")
def test_D_world_verify_catches_a_deleted_oacir_image(oac, tmp_path, capsys):
    w = _oacir_world(oac, tmp_path / "w")
    victim = _oacir_images(w)[3]
    victim.unlink()
    refused(cli(["world", "verify", w], capsys), victim.name)


@probe("D", "silently wrong")
def test_D_features_extract_refuses_swapped_oacir_images(oac, tmp_path, capsys):
    w = _oacir_world(oac, tmp_path / "w")
    a, b = _oacir_images(w)[:2]
    _swap(a, b)
    res = cli(["features", "extract", "--backbone", PRE, "--world", w, "--split", "test/oacir", "--out",
               tmp_path / "f", "--device", "cpu"], capsys)
    refused(res, (a.name, b.name))


@probe("D", "silently wrong")
def test_D_oacirr_export_refuses_swapped_oacir_images(oac, tmp_path, capsys):
    w = _oacir_world(oac, tmp_path / "w")
    a, b = _oacir_images(w)[:2]
    _swap(a, b)
    res = cli(["world", "export", "--world", w, "--format", "oacirr", "--split", "test", "--out", tmp_path / "x"],
              capsys)
    refused(res, (a.name, b.name))


@probe("D", "silently wrong")
def test_D_world_verify_catches_an_edited_ambiguous_query(tiny_world, tmp_path, capsys):
    w = world_copy(tiny_world, tmp_path / "w")
    silent(["world", "ambiguous", "--world", w, "--queries", "4"])
    path = next((w / "benchmarks").glob("*ambiguous*/*/queries.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    rec = json.loads(lines[0])
    rec["modification"] = rec["modification"] + " and make it huge"
    path.write_text(json.dumps(rec) + "\n" + "".join(lines[1:]))
    refused(cli(["world", "verify", w], capsys), "queries.jsonl")


@probe("D", "silently wrong")
def test_D_world_verify_catches_an_edited_described_query(tiny_world, tmp_path, capsys):
    w = world_copy(tiny_world, tmp_path / "w")
    silent(["world", "describe", "--world", w, "--share", "0.5", "--split", "val"])
    path = w / "benchmarks" / "val" / "described" / "queries.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    rec = json.loads(lines[0])
    rec["modification"] = rec["modification"] + " and make it huge"
    path.write_text(json.dumps(rec) + "\n" + "".join(lines[1:]))
    refused(cli(["world", "verify", w], capsys), "queries.jsonl")


@cases(Case("features-extract", "D", "silently wrong", {"cmd": "features"}),
       Case("index-build", "D", "silently wrong", {"cmd": "index"}),
       Case("decompose", "D", "silently wrong", {"cmd": "decompose"}))
def test_D_a_truncated_shard_is_an_error_naming_it_and_the_offset(case, shards, tmp_path, capsys):
    pattern = _shards_copy(shards, tmp_path / "s")
    victim = tmp_path / "s" / "00001.tar"
    _truncate(victim)
    out = tmp_path / "out"
    argv = {"features": ["features", "extract", "--backbone", PRE, "--in", pattern, "--out", out, "--device", "cpu",
                         "--workers", "0"],
            "index": ["index", "build", "--in", pattern, "--backbone", PRE, "--out", out, "--device", "cpu",
                      "--workers", "0"],
            "decompose": ["decompose", "--in", pattern, "--decomposer", "rule", "--out", out]}[case.data["cmd"]]
    res = cli(argv, capsys)
    refused(res, str(victim), ("offset", "byte"))


@probe("D", "silently wrong")
def test_D_a_missing_shard_of_the_pattern_is_an_error_naming_it(shards, tmp_path, capsys):
    pattern = _shards_copy(shards, tmp_path / "s")
    (tmp_path / "s" / "00002.tar").unlink()
    res = cli(["features", "extract", "--backbone", PRE, "--in", pattern, "--out", tmp_path / "f", "--device", "cpu",
               "--workers", "0"], capsys)
    refused(res, "00002.tar")


@probe("D", "silently wrong")
def test_D_world_oacir_rerun_with_another_count_leaves_no_old_images(tiny_world, tmp_path, capsys):
    base = ["world", "oacir", "--world", tiny_world, "--splits", "test"]
    succeeded(cli([*base, "--queries", "4", "--out", tmp_path / "oa"], capsys))
    succeeded(cli([*base, "--queries", "6", "--out", tmp_path / "oa"], capsys))
    silent([*base, "--queries", "6", "--out", tmp_path / "fresh"])
    same_tree(tmp_path / "oa", tmp_path / "fresh")


@probe("D", "silently wrong")
def test_D_world_oacir_rerun_with_fewer_queries_leaves_no_old_images(tiny_world, tmp_path, capsys):
    base = ["world", "oacir", "--world", tiny_world, "--splits", "test"]
    succeeded(cli([*base, "--queries", "6", "--out", tmp_path / "oa"], capsys))
    succeeded(cli([*base, "--queries", "3", "--out", tmp_path / "oa"], capsys))
    silent([*base, "--queries", "3", "--out", tmp_path / "fresh"])
    same_tree(tmp_path / "oa", tmp_path / "fresh")


@probe("D", "silently wrong")
def test_D_world_ambiguous_rerun_with_another_count_matches_a_fresh_run(tiny_world, tmp_path, capsys):
    base = ["world", "ambiguous", "--world", tiny_world]
    succeeded(cli([*base, "--queries", "6", "--out", tmp_path / "a"], capsys))
    succeeded(cli([*base, "--queries", "3", "--out", tmp_path / "a"], capsys))
    silent([*base, "--queries", "3", "--out", tmp_path / "fresh"])
    same_tree(tmp_path / "a", tmp_path / "fresh")


@probe("D", "silently wrong")
def test_D_webdataset_rerun_with_another_shard_size_leaves_no_stale_shards(small_world, tmp_path, capsys):
    base = ["world", "export", "--world", small_world, "--format", "webdataset", "--split", "train"]
    succeeded(cli([*base, "--out", tmp_path / "s", "--shard-size", "48"], capsys))
    succeeded(cli([*base, "--out", tmp_path / "s", "--shard-size", "96"], capsys))
    silent([*base, "--out", tmp_path / "fresh", "--shard-size", "96"])
    same_tree(tmp_path / "s", tmp_path / "fresh")


# ====================================================================================================================
# E. Bounds: a huge count is refused, naming its flag, before any work
# ====================================================================================================================

BIG, HUGE = 10 ** 12, 2 ** 62


def _e(id_, flag, needs, build, label="unhandled"):
    return Case(id_, "E", label, {"flag": flag, "needs": needs, "build": build})


E_CASES = [
    _e("world-oacir-queries", "--queries", ("tiny_world",), lambda fx, t: [
        "world", "oacir", "--world", fx["tiny_world"], "--splits", "test", "--queries", BIG, "--out", t / "o"]),
    _e("world-ambiguous-queries", "--queries", ("tiny_world",), lambda fx, t: [
        "world", "ambiguous", "--world", fx["tiny_world"], "--queries", BIG, "--out", t / "o"]),
    _e("adafocal-probes", "--probes", ("oac",), lambda fx, t: [
        "adafocal", "train", "--features", fx["oac"] / "f", "--world", fx["oac"] / "w", "--split", "train", "--out",
        t / "o", "--probes", HUGE, "--max-steps", "1", "--batch-size", "8", "--device", "cpu"]),
    _e("adafocal-layers", "--layers", ("oac",), lambda fx, t: [
        "adafocal", "train", "--features", fx["oac"] / "f", "--world", fx["oac"] / "w", "--split", "train", "--out",
        t / "o", "--layers", BIG, "--max-steps", "1", "--batch-size", "8", "--device", "cpu"]),
    _e("train-min-pairs", "--min-pairs", ("train_features", "tiny_world"), lambda fx, t: [
        "train", "--features", fx["train_features"], "--world", fx["tiny_world"], "--out", t / "o", "--min-pairs", BIG,
        "--stage1-epochs", "1", "--stage2-epochs", "0", "--batch-size", "128", "--device", "cpu"], "silently wrong"),
    _e("decompose-min-pairs", "--min-pairs", ("stores",), lambda fx, t: [
        "decompose", "--in", fx["stores"] / "c.csv", "--out", t / "s.sqlite", "--min-pairs", BIG], "silently wrong"),
    _e("features-shard-size", "--shard-size", ("tiny_world",), lambda fx, t: [
        "features", "extract", "--backbone", PRE, "--world", fx["tiny_world"], "--split", "val/multi", "--out",
        t / "f", "--shard-size", HUGE, "--device", "cpu"]),
    _e("features-workers", "--workers", ("shards",), lambda fx, t: [
        "features", "extract", "--backbone", PRE, "--in", fx["shards"][1], "--out", t / "f", "--workers", BIG,
        "--device", "cpu"]),
    _e("webdataset-shard-size", "--shard-size", ("small_world",), lambda fx, t: [
        "world", "export", "--world", fx["small_world"], "--format", "webdataset", "--split", "train", "--out",
        t / "s", "--shard-size", BIG], "silently wrong"),
    _e("index-build-workers", "--workers", ("pre",), lambda fx, t: [
        "index", "build", "--images", fx["pre"] / "imgs", "--backbone", PRE, "--out", t / "i", "--workers", BIG,
        "--device", "cpu"]),
    _e("index-update-workers", "--workers", ("pre",), lambda fx, t: [
        "index", "update", shutil.copytree(fx["pre"] / "idx", t / "i"), "--workers", BIG, "--device", "cpu"]),
    _e("index-build-train-size", "--train-size", ("pre",), lambda fx, t: [
        "index", "build", "--images", fx["pre"] / "imgs", "--backbone", PRE, "--out", t / "i", "--index-type",
        "IVF1,Flat", "--train-size", HUGE, "--workers", "0", "--device", "cpu"]),
    _e("index-build-dist-timeout", "--dist-timeout", ("shards",), lambda fx, t: [
        "index", "build", "--in", fx["shards"][1], "--features", fx["shards"][0] / "f", "--backbone", PRE, "--out",
        t / "i", "--dist-timeout", HUGE, "--workers", "0", "--device", "cpu"]),
    _e("backbone-vit-layers", "--vit-layers", ("small_world",), lambda fx, t: [
        "backbone", "train", "--world", fx["small_world"], "--out", t / "b", "--image-tower", "vit", "--vit-layers",
        BIG, "--epochs", "1", "--batch-size", "8", "--device", "cpu"]),
    _e("backbone-vit-width", "--vit-width", ("small_world",), lambda fx, t: [
        "backbone", "train", "--world", fx["small_world"], "--out", t / "b", "--image-tower", "vit", "--vit-width",
        HUGE, "--epochs", "1", "--batch-size", "8", "--device", "cpu"]),
    _e("backbone-vit-heads", "--vit-heads", ("small_world",), lambda fx, t: [
        "backbone", "train", "--world", fx["small_world"], "--out", t / "b", "--image-tower", "vit", "--vit-heads",
        BIG, "--epochs", "1", "--batch-size", "8", "--device", "cpu"]),
    _e("backbone-patch-size", "--patch-size", ("small_world",), lambda fx, t: [
        "backbone", "train", "--world", fx["small_world"], "--out", t / "b", "--image-tower", "vit", "--patch-size",
        BIG, "--epochs", "1", "--batch-size", "8", "--device", "cpu"]),
    _e("backbone-threads", "--threads", ("small_world",), lambda fx, t: [
        "backbone", "train", "--world", fx["small_world"], "--out", t / "b", "--threads", BIG, "--epochs", "1",
        "--batch-size", "8", "--device", "cpu"]),
    _e("search-k", "-k", ("pre",), lambda fx, t: [
        "search", "--index", fx["pre"] / "idx", "--reference", "1", "--text", "make it red", "--method", "sum", "-k",
        BIG, "--device", "cpu"]),
    _e("serve-workers", "--workers", ("pre",), lambda fx, t: [
        "serve", "--index", fx["pre"] / "idx", "--workers", BIG, "--device", "cpu"], "silently wrong"),
    _e("serve-max-batch", "--max-batch", ("pre",), lambda fx, t: [
        "serve", "--index", fx["pre"] / "idx", "--max-batch", HUGE, "--device", "cpu"], "silently wrong"),
    _e("serve-max-k", "--max-k", ("pre",), lambda fx, t: [
        "serve", "--index", fx["pre"] / "idx", "--max-k", HUGE, "--device", "cpu"], "silently wrong"),
    _e("serve-max-knn", "--max-knn", ("pre",), lambda fx, t: [
        "serve", "--index", fx["pre"] / "idx", "--max-knn", HUGE, "--device", "cpu"], "silently wrong"),
    _e("edits-per-caption", "--per-caption", ("tiny_world",), lambda fx, t: [
        "edits", "generate", "--in", fx["tiny_world"], "--out", t / "e.sqlite", "--limit", "2", "--per-caption",
        BIG]),
    _e("decompose-concurrency", "--concurrency", ("stores",), lambda fx, t: [
        "decompose", "--in", fx["stores"] / "c.csv", "--out", t / "s.sqlite", "--decomposer", "llm", "--llm-url",
        "http://127.0.0.1:9/v1", "--llm-model", "m", "--concurrency", BIG, "--retries", "0", "--timeout", "1"],
       "silently wrong"),
    _e("train-negative-groups", "--negative-groups", ("train_features", "tiny_world"), lambda fx, t: [
        "train", "--features", fx["train_features"], "--world", fx["tiny_world"], "--out", t / "o",
        "--negative-groups", BIG, "--stage1-epochs", "1", "--stage2-epochs", "0", "--batch-size", "128", "--device",
        "cpu"]),
]


@pytest.fixture()
def no_server(monkeypatch):
    """`uvicorn.run` records its call instead of serving: a `foco serve` that reaches it accepted its options."""
    import uvicorn
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: calls.append(k))
    return calls


@cases(*E_CASES)
def test_E_a_huge_count_is_refused_naming_its_flag(case, request, tmp_path, capsys, no_server):
    fx = _fx(request, case.data["needs"])
    argv = case.data["build"](fx, tmp_path)
    before = {p for p in tmp_path.rglob("*") if p.is_file()}
    res = cli_forked(argv, timeout=2.5, extra_mb=1536)
    flag = case.data["flag"]
    refused(res, (flag, flag.lstrip("-").replace("-", "_")))
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and p not in before)
    check(not written, f"refused only after writing {written[:4]}: not before any work")


# ====================================================================================================================
# F. Text parsed by hand
# ====================================================================================================================

@pytest.fixture()
def search_argv(pre):
    return ["search", "--index", pre / "idx", "--reference", "1", "--text", "make it red", "--method", "foco",
            "--checkpoint", pre / "foco", "-k", "3", "--json", "--keep-reference", "--device", "cpu"]


@cases(Case("underscore", "F", "silently wrong", {"box": "1_0,0,30,30"}),
       Case("nan", "F", "silently wrong", {"box": "nan,0,30,30"}),
       Case("hex", "F", "unhandled", {"box": "0x1,0,30,30"}),
       Case("inf", "F", "silently wrong", {"box": "0,0,inf,30"}),
       Case("arity-3", "F", "unhandled", {"box": "0,0,30"}),
       Case("arity-5", "F", "unhandled", {"box": "0,0,30,30,1"}),
       Case("empty-field", "F", "unhandled", {"box": "0,,30,30"}),
       Case("arabic-indic-digit", "F", "silently wrong", {"box": "\u0661,0,30,30"}))
def test_F_search_box_text_is_refused_naming_the_flag(case, search_argv, capsys):
    refused(cli([*search_argv, "--box", case.data["box"]], capsys), ("--box", "box ("))


@probe("F", "silently wrong")
def test_F_search_box_with_spaces_is_read_as_written_or_refused(search_argv, capsys):
    plain = cli([*search_argv, "--box", "0,0,30,30"], capsys)
    succeeded(plain)
    spaced = cli([*search_argv, "--box", " 0, 0, 30, 30"], capsys)
    _common(spaced, ())
    if spaced.code == 2:
        refused(spaced, "--box")
    else:
        check(spaced.out == plain.out, f"' 0, 0, 30, 30' read otherwise than '0,0,30,30': {spaced.out!r} vs "
              f"{plain.out!r}")


@pytest.fixture(scope="module")
def served(pre):
    from fastapi.testclient import TestClient
    from foco.search.engine import SearchEngine
    from foco.serve.app import ServeLimits, create_app
    shared: dict = {}
    raw = SearchEngine.open(pre / "idx", backbones=shared, checkpoint=pre / "foco", pic2word=pre / "p2w_raw",
                            lincir=pre / "lincir", adafocal=pre / "ada")
    norm = SearchEngine.open(pre / "idx", backbones=shared, pic2word=pre / "p2w_norm")
    clients = {name: TestClient(create_app({name: e}, ServeLimits(), watch=False), raise_server_exceptions=False)
               for name, e in (("raw", raw), ("norm", norm))}
    return clients


def _png(colour="red", size=64) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "PNG")
    return buf.getvalue()


@cases(Case("underscore", "F", "silently wrong", {"box": "1_0,0,30,30"}),
       Case("arabic-indic-digit", "F", "silently wrong", {"box": "\u0661,0,30,30"}),
       Case("fullwidth-digit", "F", "silently wrong", {"box": "\uff11,0,30,30"}),
       Case("spaces-inside-number", "F", "silently wrong", {"box": "1 0,0,30,30"}))
def test_F_server_box_field_is_refused_naming_box(case, served, capsys):
    r = served["raw"].post("/search", data={"reference_id": "1", "text": "make it red", "k": "3", "method": "foco",
                                            "box": case.data["box"]})
    if r.status_code >= 500:
        fail("unhandled", f"{r.status_code}: {r.text}")
    if r.status_code == 200:
        fail("silently wrong", f"box {case.data['box']!r} accepted: {r.text[:200]}")
    check("box" in r.json().get("error", ""), f"refused without naming box: {r.text}")


@probe("F", "silently wrong")
def test_F_server_chord_written_with_an_underscore_is_refused(served):
    r = served["raw"].post("/search", data={"reference_id": "1", "text": "make it red", "k": "3", "method": "sum",
                                            "chord": "1_0"})
    if r.status_code >= 500:
        fail("unhandled", r.text)
    check(r.status_code == 400 and "chord" in r.text, f"chord '1_0' accepted ({r.status_code}: {r.text[:200]})")


@cases(Case("lone-brace", "F", "unhandled", {"t": "{"}),
       Case("two-indexed-fields", "F", "unhandled", {"t": "{0}{1}"}),
       Case("named-field", "F", "unhandled", {"t": "{name}"}),
       Case("star-and-open-brace", "F", "unhandled", {"t": "a photo of * that {} {"}),
       Case("star-and-second-field", "F", "unhandled", {"t": "a photo of * that {} and {}"}),
       Case("star-and-named-field", "F", "unhandled", {"t": "a photo of * that {} {name}"}),
       Case("star-and-manual-index", "F", "unhandled", {"t": "a photo of * that {} {0}"}),
       Case("star-and-closing-brace", "F", "unhandled", {"t": "a photo of * that {}}"}),
       Case("giant-width", "F", "unhandled", {"t": "a photo of * {:>4611686018427387904} that {}"}))
def test_F_pic2word_template_that_format_rejects_is_refused(case, tiny_world, eval_features, p2w_bb, capsys):
    res = cli(["eval", "--benchmark", "world", "--root", tiny_world, "--split", "test", "--features", eval_features,
               "--protocols", "single", "--methods", "pic2word", "--pic2word", p2w_bb, "--pic2word-template",
               case.data["t"], "--device", "cpu"], capsys, timeout=60, extra_mb=3072)
    refused(res, "--pic2word-template")


def _first_slot_only():
    """A `placeholder_slots` that keeps each text's first placeholder only (the template's: its * comes before
    the modification), so that a user's own `*` is read as the word it is."""
    import foco.backbones.world as bw
    orig = bw.placeholder_slots

    def first(*args, **kwargs):
        s = orig(*args, **kwargs)
        out = torch.zeros_like(s)
        rows = torch.arange(s.shape[0])
        idx = s.float().argmax(dim=1)
        out[rows, idx] = s[rows, idx]
        return out
    return bw, first


def _star_results(run, monkeypatch):
    """(what `run` gives, what it should give: the same with only the template's placeholder replaced)."""
    got = run()
    bw, first = _first_slot_only()
    with monkeypatch.context() as m:
        m.setattr(bw, "placeholder_slots", first)
        want = run()
    return got, want


@probe("F", "silently wrong")
def test_F_a_users_star_in_a_search_text_stays_a_word(pre, capsys, monkeypatch):
    argv = ["search", "--index", pre / "idx", "--reference", "1", "--text", "make the * red", "--method", "pic2word",
            "--pic2word", pre / "p2w_norm", "-k", "6", "--json", "--keep-reference", "--device", "cpu"]

    def run():
        res = cli(argv, capsys)
        _common(res, ())
        return res
    got, want = _star_results(run, monkeypatch)
    if got.code == 2:
        refused(got, "*")
        return
    check(got.out == want.out, "the user's * was read as the image's pseudo word: scores "
          f"{got.out.splitlines()[:2]} where the text as written gives {want.out.splitlines()[:2]}")


@probe("F", "silently wrong")
def test_F_a_users_star_in_a_server_text_stays_a_word(served, monkeypatch):
    def run():
        r = served["norm"].post("/search", data={"reference_id": "1", "text": "make the * red", "k": "6",
                                                 "method": "pic2word"})
        if r.status_code >= 500:
            fail("unhandled", r.text)
        return r
    got, want = _star_results(run, monkeypatch)
    if got.status_code == 400:
        check("*" in got.text, f"refused without naming the *: {got.text}")
        return
    a = [(h["id"], h["score"]) for h in got.json()["results"]]
    b = [(h["id"], h["score"]) for h in want.json()["results"]]
    check(a == b, f"the user's * was read as the image's pseudo word: {a[:2]} where the text as written gives {b[:2]}")


@probe("F", "silently wrong")
def test_F_a_users_star_in_a_lincir_query_stays_a_word(pre, monkeypatch):
    from foco import create_backbone
    from foco.methods.lincir import LinCIRMethod, LinCIRPhi
    backbone = create_backbone(PRE)
    method = LinCIRMethod(LinCIRPhi.load(pre / "lincir"), backbone)
    torch.manual_seed(0)
    ref = torch.randn(1, 256)

    def run():
        try:
            return method.encode_raw(ref, ["make the * red"], backbone).query
        except ValueError as exc:
            return exc
    got, want = _star_results(run, monkeypatch)
    if isinstance(got, Exception):
        check("*" in str(got), f"refused without naming the *: {got}", "unhandled")
        return
    check(torch.allclose(got, want, atol=1e-6), "the user's * was read as the image's pseudo word (LinCIR)")


@cases(Case("underscore", "F", "silently wrong", {"shard": "1_0/2_0"}),
       Case("arabic-indic", "F", "silently wrong", {"shard": "\u0660/\u0662"}),
       Case("three-parts", "F", "silently wrong", {"shard": "0/2/4"}),
       Case("huge-n", "F", "silently wrong", {"shard": f"0/{10 ** 30}"}))
def test_F_decompose_shard_text_is_refused(case, stores, tmp_path, capsys):
    res = cli(["decompose", "--in", stores / "c.csv", "--out", tmp_path / "s.sqlite", "--shard", case.data["shard"]],
              capsys)
    refused(res, "--shard", absent=[tmp_path / "s.sqlite"])


@cases(Case("duplicate", "F", "silently wrong", {"splits": "test,test"}),
       Case("capitalised", "F", "unhandled", {"splits": "Test"}),
       Case("empty-item", "F", "silently wrong", {"splits": "test,,"}))
def test_F_world_oacir_splits_text(case, tiny_world, tmp_path, capsys):
    """A split list is refused naming --splits, or read as the one split it names (the same files as `test`)."""
    res = cli(["world", "oacir", "--world", tiny_world, "--splits", case.data["splits"], "--queries", "3", "--out",
               tmp_path / "oa"], capsys)
    _common(res, ())
    if res.code == 2:
        refused(res, "--splits")
        return
    silent(["world", "oacir", "--world", tiny_world, "--splits", "test", "--queries", "3", "--out", tmp_path / "fresh"])
    same_tree(tmp_path / "oa", tmp_path / "fresh")


@cases(Case("bogus", "F", "unhandled", {"split": "val,bogus"}),
       Case("duplicate", "F", "silently wrong", {"split": "val,val"}))
def test_F_world_describe_split_list(case, tiny_world, tmp_path, capsys):
    w = world_copy(tiny_world, tmp_path / "w")
    res = cli(["world", "describe", "--world", w, "--share", "0.5", "--split", case.data["split"]], capsys)
    _common(res, ())
    if res.code == 2:
        refused(res, "--split")
        return
    check("bogus" not in case.data["split"], "a split that does not exist was accepted", "silently wrong")
    v = cli(["world", "verify", w], capsys)
    check(v.code == 0, f"the world fails verify after describing {case.data['split']}: {v.show()}")


@probe("F", "unhandled")
def test_F_index_type_faiss_cannot_read_is_refused_naming_the_flag(pre, tmp_path, capsys):
    res = cli(["index", "build", "--images", pre / "imgs", "--backbone", PRE, "--out", tmp_path / "i", "--index-type",
               "Bogus42", "--workers", "0", "--device", "cpu"], capsys)
    refused(res, "--index-type")


# ====================================================================================================================
# G. Serving: a listed method never answers with a 500
# ====================================================================================================================

def _listed(client) -> list[str]:
    r = client.get("/healthz")
    assert r.status_code == 200, r.text
    return r.json()["methods"]


def _query(client, method: str, reference: str, box: str | None = None):
    data = {"text": "make it red", "k": "3", "method": method}
    if box:
        data["box"] = box
    files = None
    if reference == "indexed":
        data["reference_id"] = "1"
    else:
        files = {"image": ("r.png", _png("blue"), "image/png")}
    return client.post("/search", data=data, files=files)


@cases(*[Case(f"{m}-{ref}", "G", "unhandled", {"method": m, "ref": ref})
         for m in ("pic2word", "lincir", "foco", "adafocal") for ref in ("indexed", "upload")],
       Case("foco-box", "G", "unhandled", {"method": "foco", "ref": "indexed", "box": "0,0,40,40"}),
       Case("adafocal-box", "G", "unhandled", {"method": "adafocal", "ref": "indexed", "box": "0,0,40,40"}),
       Case("adafocal-box-upload", "G", "unhandled", {"method": "adafocal", "ref": "upload", "box": "8,8,56,56"}))
def test_G_a_listed_method_answers(case, served):
    client = served["raw"]
    m = case.data["method"]
    r = _query(client, m, case.data["ref"], case.data.get("box"))
    if r.status_code >= 500:
        fail("unhandled", f"method {m} is listed ({_listed(client)}) and answered {r.status_code}: {r.text}")
    if m in _listed(client):
        check(r.status_code == 200 and len(r.json()["results"]) == 3, f"listed method {m}: {r.status_code} "
              f"{r.text[:300]}", "silently wrong")
    else:
        check(r.status_code == 400 and m in r.text, f"unlisted method {m}: {r.status_code} {r.text[:300]}",
              "silently wrong")


@pytest.fixture(scope="module")
def served_shards(shards, pre):
    from fastapi.testclient import TestClient
    from foco.search.engine import SearchEngine
    from foco.serve.app import ServeLimits, create_app
    root, _ = shards
    e = SearchEngine.open(root / "idx", checkpoint=pre / "foco", pic2word=pre / "p2w_norm", adafocal=pre / "ada")
    return TestClient(create_app({"s": e}, ServeLimits(), watch=False), raise_server_exceptions=False)


@cases(*[Case(f"shards-{m}-{ref}", "G", "unhandled", {"method": m, "ref": ref})
         for m in ("foco", "pic2word", "adafocal") for ref in ("indexed", "upload")])
def test_G_a_listed_method_answers_on_an_index_of_shards(case, served_shards):
    m = case.data["method"]
    r = _query(served_shards, m, case.data["ref"])
    if r.status_code >= 500:
        fail("unhandled", f"method {m} is listed ({_listed(served_shards)}) and answered {r.status_code}: {r.text}")
    if m in _listed(served_shards):
        check(r.status_code == 200, f"listed method {m}: {r.status_code} {r.text[:300]}", "silently wrong")


@cases(Case("lincir", "G", "unhandled", {"method": "lincir", "flag": "--lincir", "dir": "lincir"}),
       Case("pic2word-raw", "G", "unhandled", {"method": "pic2word", "flag": "--pic2word", "dir": "p2w_raw"}))
def test_G_search_with_a_pseudo_word_method_answers_or_says_why_not(case, pre, capsys):
    """`foco search` with a valid weights folder either answers, or refuses naming the method's flag (what the
    index lacks for it), never a message about features the user never extracted."""
    res = cli(["search", "--index", pre / "idx", "--reference", "1", "--text", "make it red", "--method",
               case.data["method"], case.data["flag"], pre / case.data["dir"], "-k", "3", "--json", "--device", "cpu"],
              capsys)
    _common(res, ())
    if res.code == 2:
        refused(res, (case.data["flag"], case.data["method"]))
        return
    check(len(res.out.strip().splitlines()) == 3, f"expected 3 results: {res.out!r}", "silently wrong")


@probe("G", "unhandled")
def test_G_serve_lists_only_what_it_can_answer(pre, capsys, no_server):
    """`foco serve`'s start line lists the methods; each listed one must answer a query."""
    res = cli(["serve", "--index", pre / "idx", "--lincir", pre / "lincir", "--pic2word", pre / "p2w_raw", "--device",
               "cpu"], capsys)
    succeeded(res)
    from fastapi.testclient import TestClient
    from foco.search.engine import SearchEngine
    from foco.serve.app import ServeLimits, create_app
    engine = SearchEngine.open(pre / "idx", lincir=pre / "lincir", pic2word=pre / "p2w_raw")
    client = TestClient(create_app({"i": engine}, ServeLimits(), watch=False), raise_server_exceptions=False)
    bad = {}
    for m in _listed(client):
        r = _query(client, m, "indexed")
        if r.status_code != 200:
            bad[m] = r.status_code
    check(not bad, f"listed methods that do not answer: {bad}")
