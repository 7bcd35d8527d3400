#!/usr/bin/env python3
"""A probe of issue 42's eight classes of silent or unhandled failure, on cases the issue does not list.

Each case is a mistake or an accident a new user can meet with real files: a record file of foco's with a damaged
field, a shard or a weights file swapped with another artifact's, a world manifest edited by hand, NaN, huge or
negative numbers in options, zero-width, BOM, surrogate or UTF-16 text, a full or read-only disk, a run killed and
resumed, and a command writing into a folder of another kind.

The probe builds its tiny artifacts once (a tiny world and a second one, feature caches of two backbones, a FoCo
checkpoint, a Pic2Word mapper, a world backbone, an index, decomposition and edit stores), runs each case through
the command line (`<python> -m foco ...`, a subprocess with a time limit) and classifies the outcome mechanically
from the case's declared expectation:

- ``clear error``: nonzero exit, no Python traceback, and the message names the offending file, field or option
  (the case lists the names it accepts; ownership cases also need the true reason, e.g. the folder's kind);
- ``correct``: exit 0 and the result equals the clean run's (outputs compared: eval tables, search results,
  tensors, store rows, logs), or the input was legitimately fine;
- ``silent``: exit 0 but a result different from the clean run's, or damaged input accepted without a word;
- ``unhandled``: a traceback, a nonzero exit whose message names nothing of the case (a raw library message), or a
  hang (the time limit; a server that ignores SIGTERM).

Usage::

    /work/main/.venv/bin/python experiments/probe_issue42.py --repo /tmp/before42 --out /tmp/probe42-before.json

`--repo` is a checkout whose `src` goes first on PYTHONPATH; `--python` the interpreter (default: this repo's
venv). Work folders go under `--work` (default /tmp/probe42-run-<time>). `--only SUBSTR` runs the cases whose
name holds SUBSTR (several: comma-separated). Class 6 mounts small tmpfs file systems (full and read-only disks)
when run as root, and falls back to RLIMIT_FSIZE for a full disk otherwise (read-only cases are then skipped).
Every subprocess runs with one torch thread (OMP_NUM_THREADS=1).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

CLASSES = {
    1: "1 provenance",
    2: "2 content hashes",
    3: "3 numbers",
    4: "4 record files",
    5: "5 text rules",
    6: "6 write errors",
    7: "7 state before logs",
    8: "8 ownership by kind",
}
OUTCOMES = ("clear error", "correct", "silent", "unhandled")

# ------------------------------------------------------------------------------------------------------------ running


@dataclass
class Res:
    rc: int | None
    out: str = ""
    err: str = ""
    timed_out: bool = False
    seconds: float = 0.0
    same: bool | None = None       # the result equals the clean run's (None: not compared)
    note: str = ""                 # what the probe saw besides the exit (a comparison, a changed folder)
    skipped: str = ""              # why the case could not run here


class Ctx:
    def __init__(self, repo: Path, python: str, work: Path, verbose: bool):
        self.repo, self.python, self.work, self.verbose = repo, python, work, verbose
        self.base = work / "base"
        self.env = dict(os.environ)
        self.env.update({
            "PYTHONPATH": str(repo / "src") + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH")
                                               else ""),
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
        })
        self.mounts: list[Path] = []
        self.is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        self.clean: dict = {}
        self.state: dict = {}          # what a case leaves for the next (a full disk to free)

    def cmd(self, args) -> list:
        return [self.python, "-m", "foco", *[a if isinstance(a, bytes) else str(a) for a in args]]

    def foco(self, args, *, cwd: Path | None = None, timeout: float = 240, fsize: int | None = None) -> Res:
        """Run `python -m foco ARGS`; a byte-string argument goes as it is (invalid UTF-8 in argv)."""
        cmd = self.cmd(args)
        pre = None
        if fsize is not None:
            def pre():
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, cwd=cwd or self.work, env=self.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True, preexec_fn=pre)
        try:
            out, err = p.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            timed_out = True
        res = Res(p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out,
                  time.monotonic() - t0)
        if self.verbose:
            shown = " ".join(a.decode("utf-8", "backslashreplace") if isinstance(a, bytes) else a for a in cmd[3:])
            print(f"    $ foco {shown[:160]}  -> rc {res.rc} in {res.seconds:.1f}s", flush=True)
        return res

    def must(self, args, **kw) -> Res:
        r = self.foco(args, **kw)
        if r.rc != 0:
            raise SystemExit(f"probe build step failed: foco {' '.join(map(str, args))}\n{r.err[-3000:]}")
        return r

    # tmpfs mounts for full and read-only disks (root only)
    def tmpfs(self, path: Path, size: str, ro: bool = False) -> bool:
        if not self.is_root:
            return False
        path.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode != 0:
            return False
        self.mounts.append(path)
        if ro:
            (path / "out").mkdir()
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        return True

    def shrink(self, path: Path, spare: int) -> bool:
        """Leave `spare` bytes free on a tmpfs mount (a disk about to fill)."""
        st = os.statvfs(path)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        size = (used + spare + 4095) // 4096 * 4096
        return subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], capture_output=True).returncode == 0

    def grow(self, path: Path, size: str = "256m"):
        subprocess.run(["mount", "-o", f"remount,rw,size={size}", str(path)], check=True)

    def unmount_all(self):
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        self.mounts.clear()


def run_and_kill(ctx: Ctx, args, trigger: Callable[[], bool], *, timeout: float = 240, poll: float = 0.003) -> str:
    """Start `foco ARGS` and SIGKILL its process group as soon as `trigger()` holds. Returns what happened."""
    p = subprocess.Popen(ctx.cmd(args), cwd=ctx.work, env=ctx.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < timeout:
        try:
            hit = trigger()
        except Exception:  # a file read while it is written
            hit = False
        if hit:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return "killed"
        time.sleep(poll)
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return "timeout before the trigger"
    return f"finished (rc {p.returncode}) before the trigger"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(ctx: Ctx, args, *, start_s: float = 25, probe: Callable[[int], str] | None = None) -> Res:
    """`foco serve ARGS --port P`: the exit if it stops by itself; else whether it answered, then SIGTERM (a server
    that outlives SIGTERM by 10 s is a hang)."""
    port = free_port()
    p = subprocess.Popen(ctx.cmd([*args, "--port", port]), cwd=ctx.work, env=ctx.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    t0 = time.monotonic()
    up = False
    while time.monotonic() - t0 < start_s and p.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
            up = True
            break
        except Exception:
            time.sleep(0.3)
    note = ""
    if p.poll() is None:
        if up and probe:
            try:
                note = probe(port)
            except Exception as e:  # noqa: BLE001
                note = f"probe request failed: {e!r}"[:200]
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            hung = True
        out, err = p.communicate()
        res = Res(0 if not hung else None, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                  timed_out=hung or not up, seconds=time.monotonic() - t0)
        res.note = ("served; " if up else "neither answered nor stopped; ") + note + \
                   ("; ignored SIGTERM" if hung else "")
        return res
    out, err = p.communicate()
    return Res(p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), False,
               time.monotonic() - t0)


# ---------------------------------------------------------------------------------------------------- file helpers

def copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return dst


def clone_world(ctx: Ctx, dst: Path, world: str = "W", real_images: bool = False) -> Path:
    """A copy of a base world; its images folder a symlink to the original's unless `real_images`."""
    src = ctx.base / world
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.name == "images" and not real_images:
            (dst / "images").symlink_to(p, target_is_directory=True)
        elif p.is_dir():
            shutil.copytree(p, dst / p.name)
        else:
            shutil.copy2(p, dst / p.name)
    return dst


def jload(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def jsave(path: Path, obj):
    path.write_text(json.dumps(obj, indent=1, allow_nan=True), encoding="utf-8")


def jedit(path: Path, fn):
    obj = jload(path)
    out = fn(obj)
    jsave(path, obj if out is None else out)


def edit_jsonl(path: Path, fn):
    """fn(list of dicts) -> list of dicts (or None); written back one JSON object a line."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    out = fn(rows)
    rows = rows if out is None else out
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def world_rehash(world: Path, rel: str):
    """Record a hand-edited manifest's new sha256 in world.json (so that only the edit's meaning is tested)."""
    jedit(world / "world.json", lambda w: w["manifests_sha256"].__setitem__(rel, sha256_file(world / rel)))


def st_tensors(path: Path) -> dict[str, str]:
    """{tensor name: sha256 of its bytes} of a safetensors file, read without torch."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    return {k: hashlib.sha256(raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]]).hexdigest()
            for k, v in header.items() if k != "__metadata__"}


def st_flip(path: Path, name: str | None = None, at: float = 0.5):
    """Flip one bit of a tensor's data (the first F32 tensor, or `name`), in place."""
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for k, v in header.items():
        if k == "__metadata__" or (name and k != name) or (not name and v["dtype"] not in ("F32", "F16", "BF16")):
            continue
        a, b = v["data_offsets"]
        raw[8 + n + a + int((b - a) * at)] ^= 0x10
        path.unlink()
        path.write_bytes(bytes(raw))
        return k
    raise ValueError(f"no tensor to flip in {path}")


def eval_parts(path: Path):
    return jload(path)["parts"] if path.exists() else None


def search_rows(res: Res) -> list | None:
    rows = [json.loads(line) for line in res.out.splitlines() if line.startswith("{")]
    return rows or None


def rows_finite(rows, k) -> bool:
    import math
    return bool(rows) and len(rows) == k and all(isinstance(r.get("score"), (int, float))
                                                 and math.isfinite(r["score"]) for r in rows)


def log_rows(path: Path) -> list | None:
    """A JSONL log's rows without their timings (elapsed, seconds, per-second rates)."""
    if not path.exists():
        return None
    rows = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            rows.append(("unparsable", line))
            continue
        if isinstance(r, dict):
            r = {k: v for k, v in r.items() if not re.search(r"elapsed|second|per_s|_s$|time|date", k)}
        rows.append(r)
    return rows


def store_rows(path: Path, table: str, cols: str) -> list:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(con.execute(f"SELECT {cols} FROM {table}").fetchall())
    finally:
        con.close()


def cache_digest(cache: Path) -> dict:
    """A feature cache's meaning: every shard record's ids and sha256, and the manifest's counts."""
    out = {}
    for rec in sorted(cache.glob("*/shard-*.json")):
        r = jload(rec)
        ids = hashlib.sha256(json.dumps(r.get("ids")).encode()).hexdigest()
        out[str(rec.relative_to(cache))] = (r.get("sha256"), ids)
    m = jload(cache / "manifest.json")
    out["counts"] = (m.get("images", {}).get("count"), m.get("texts", {}).get("count"), m.get("embed_dim"))
    return out


def folder_state(folder: Path) -> list:
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file()) \
        if folder.exists() else []


# --------------------------------------------------------------------------------------------------- classification

_TRACEBACK = "Traceback (most recent call last)"


def significant(err: str) -> str:
    """stderr without the argparse usage block, faiss's loader lines, progress bars and INFO/DEBUG log lines."""
    keep, in_usage = [], False
    for line in err.splitlines():
        if line.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and (line.startswith(" ") or not line.strip()):
            continue
        in_usage = False
        if ("faiss.loader" in line or "No module named 'faiss.swigfaiss" in line or "it/s]" in line
                or "s/it]" in line or re.search(r"\d+%\|", line)
                or re.match(r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|DEBUG) ", line)):
            continue
        keep.append(line)
    return "\n".join(keep).strip()


def classify(case: "Case", r: Res) -> tuple[str, str]:
    text = significant(r.err)
    low = (text + "\n" + r.out).lower()
    if r.timed_out:
        return "unhandled", f"hang or time limit ({r.seconds:.0f}s); {r.note}"
    if _TRACEBACK in r.err:
        tail = [ln for ln in r.err.strip().splitlines() if ln.strip()][-1:]
        return "unhandled", "traceback: " + (tail[0] if tail else "")
    if r.rc != 0:
        named = not case.names or any(n.lower() in low for n in case.names)
        reason = not case.reason or any(n.lower() in low for n in case.reason)
        if named and reason:
            if case.expect in ("ok", "same"):
                return "clear error", "[refused an input the case holds legitimate] " + text
            return "clear error", text
        why = "names none of " + repr(case.names) if not named else "no true reason among " + repr(case.reason)
        return "unhandled", f"[message {why}] " + text
    # exit 0
    if case.expect == "error":
        if case.warn and any(n.lower() in low for n in case.warn):
            return "correct", "[accepted with a warning] " + text
        return "silent", "[accepted] " + (r.note or text)
    if r.same is False:
        return "silent", "[result differs from the clean run] " + (r.note or text)
    return "correct", r.note or text


@dataclass
class Case:
    cls: int
    name: str
    expect: str                      # "error": must be refused; "same": exit 0 only with the clean result;
    fn: Callable                     # "error_or_same": either; "ok": a legitimate input, exit 0 expected
    names: tuple = ()                # any of these in the message: the offending file / field / option
    reason: tuple = ()               # and any of these: the true reason (ownership)
    warn: tuple = ()                 # exit 0 with one of these in stderr counts as a warning, not silence
    what: str = ""


CASES: list[Case] = []


def case(cls: int, name: str, expect: str, names=(), reason=(), warn=(), what: str = ""):
    assert expect in ("error", "same", "error_or_same", "ok")

    def deco(fn):
        CASES.append(Case(cls, name, expect, fn, tuple(names), tuple(reason), tuple(warn), what or (fn.__doc__ or "")))
        return fn
    return deco


# ------------------------------------------------------------------------------------------------- the base artifacts

TRAIN = ["--stage1-epochs", "1", "--stage2-epochs", "0", "--batch-size", "64"]
P2W_ARGS = ["--epochs", "1", "--batch-size", "128"]


def build(ctx: Ctx):
    b = ctx.base
    b.mkdir(parents=True)
    t0 = time.monotonic()
    print("building the base artifacts ...", flush=True)
    ctx.must(["world", "generate", "--out", b / "W", "--size", "tiny"])
    ctx.must(["world", "generate", "--out", b / "W2", "--size", "tiny", "--seed", "1"])
    for split in ("train", "test/single", "test/multi", "val/single"):
        ctx.must(["features", "extract", "--backbone", "world:pretrained", "--world", b / "W", "--split", split,
                  "--out", b / "F" / split.replace("/", "-")])
    ctx.must(["backbone", "train", "--world", b / "W", "--out", b / "BB", "--epochs", "1", "--batch-size", "128",
              "--seed", "1"])
    for split in ("test/single", "test/multi"):
        ctx.must(["features", "extract", "--backbone", f"world:{b / 'BB'}", "--world", b / "W", "--split", split,
                  "--out", b / "FBB" / split.replace("/", "-")])
    ctx.must(["train", "--features", b / "F/train", "--world", b / "W", "--out", b / "CK", *TRAIN, "--seed", "0"])
    ctx.must(["train", "--features", b / "F/train", "--world", b / "W", "--out", b / "CK1", *TRAIN, "--seed", "1"])
    ctx.must(["pic2word", "train", "--features", b / "F/train", "--out", b / "P2W", *P2W_ARGS, "--seed", "0"])
    img = b / "IMG"
    img.mkdir()
    for p in sorted((b / "W/images/test-single").glob("*.png"))[:20]:
        shutil.copy2(p, img / p.name)
    ctx.must(["index", "build", "--images", img, "--backbone", "world:pretrained", "--out", b / "IDX"])
    ctx.must(["decompose", "--in", b / "W", "--split", "train", "--out", b / "D.sqlite"])
    ctx.must(["decompose", "--in", b / "W2", "--split", "train", "--out", b / "DW2.sqlite"])
    ctx.must(["edits", "generate", "--in", b / "W", "--split", "train", "--out", b / "ED.sqlite", "--limit", "50"])
    caps = ["a red car next to a small dog", "two cats on a sofa with a blue pillow",
            "a man riding a horse on the beach"]
    (b / "caps.csv").write_text("id,caption\n" + "".join(f"{i},{c}\n" for i, c in enumerate(caps)), encoding="utf-8")
    (b / "caps.jsonl").write_text("".join(json.dumps({"id": str(i), "caption": c}) + "\n"
                                          for i, c in enumerate(caps)), encoding="utf-8")
    ctx.must(["decompose", "--in", b / "caps.csv", "--out", b / "Dcsv.sqlite"])
    # the clean results every comparison is made against
    c = ctx.clean
    ctx.must(_eval(b / "W", b / "F", "sum,image,text", b / "E-sum.json"))
    c["eval_sum"] = eval_parts(b / "E-sum.json")
    ctx.must(_eval(b / "W", b / "F", "foco", b / "E-foco.json", "--checkpoint", b / "CK"))
    c["eval_foco"] = eval_parts(b / "E-foco.json")
    ctx.must(_eval(b / "W", b / "F", "pic2word", b / "E-p2w.json", "--pic2word", b / "P2W"))
    c["eval_p2w"] = eval_parts(b / "E-p2w.json")
    c["search_sum"] = search_rows(ctx.must(_search(b / "IDX", "--method", "sum")))
    c["search_path"] = search_rows(ctx.must(_search(b / "IDX", "--method", "sum", ref=b / "IMG/test-sg000003.png")))
    c["search_foco"] = search_rows(ctx.must(_search(b / "IDX", "--method", "foco", "--checkpoint", b / "CK")))
    c["ck"] = st_tensors(b / "CK/foco.safetensors")
    c["p2w"] = st_tensors(b / "P2W/pic2word.safetensors")
    c["cache_test_single"] = cache_digest(b / "F/test-single")
    c["dcsv"] = store_rows(b / "Dcsv.sqlite", "decompositions", "caption_hash, caption, record, flag")
    c["ed"] = store_rows(b / "ED.sqlite", "triplets", "source_id, i, kind, record")
    print(f"base artifacts built in {time.monotonic() - t0:.0f}s", flush=True)


def _eval(world, feats, methods, out, *extra):
    return ["eval", "--benchmark", "world", "--root", world, "--split", "test", "--features", feats,
            "--methods", methods, "--out", out, *extra]


def _search(index, *extra, ref="3", text="make it red", k="5"):
    return ["search", "--index", index, "--reference", ref, "--text", text, "-k", k, "--json", *extra]


def eval_case(ctx: Ctx, wd: Path, methods: str, clean_key: str, *extra, world=None, feats=None) -> Res:
    out = wd / "E.json"
    r = ctx.foco(_eval(world or ctx.base / "W", feats or ctx.base / "F", methods, out, *extra))
    if r.rc == 0:
        r.same = eval_parts(out) == ctx.clean[clean_key]
        if not r.same:
            r.note = "eval table differs from the clean run's"
    return r


def search_case(ctx: Ctx, clean_key: str, *args, **kw) -> Res:
    r = ctx.foco(_search(*args, **kw))
    if r.rc == 0:
        rows = search_rows(r)
        r.same = rows == ctx.clean[clean_key]
        r.note = "" if r.same else f"search results differ from the clean run's: {json.dumps(rows)[:120]}"
    return r


# ======================================================================================================== 1 provenance

OTHER_SHA = hashlib.sha256(b"weights of some other backbone").hexdigest()


@case(1, "eval: checkpoint record claims other backbone weights (weights_sha256 edited)", "error",
      names=("foco.json", "weights_sha256", "sha256", "weights", "--checkpoint"))
def c1_ckpt_other_sha(ctx, wd):
    ck = copy(ctx.base / "CK", wd / "ck")
    jedit(ck / "foco.json", lambda m: m["provenance"]["backbone"].__setitem__("weights_sha256", OTHER_SHA))
    return eval_case(ctx, wd, "foco", "eval_foco", "--checkpoint", ck)


@case(1, "search: checkpoint record claims other backbone weights", "error",
      names=("foco.json", "weights_sha256", "sha256", "weights", "--checkpoint"))
def c1_search_ckpt_other_sha(ctx, wd):
    ck = copy(ctx.base / "CK", wd / "ck")
    jedit(ck / "foco.json", lambda m: m["provenance"]["backbone"].__setitem__("weights_sha256", OTHER_SHA))
    return search_case(ctx, "search_foco", ctx.base / "IDX", "--method", "foco", "--checkpoint", ck)


@case(1, "eval: pic2word.json without its provenance record", "error",
      names=("pic2word.json", "provenance", "unverified", "--pic2word"))
def c1_p2w_no_provenance(ctx, wd):
    p = copy(ctx.base / "P2W", wd / "p2w")
    jedit(p / "pic2word.json", lambda m: [m.pop("provenance"), None][1])  # the record edited, not replaced
    return eval_case(ctx, wd, "pic2word", "eval_p2w", "--pic2word", p)


@case(1, "search by image path after the index's backbone folder was replaced by another backbone", "error",
      names=("weights", "sha256", "backbone", "--index"))
def c1_index_backbone_replaced(ctx, wd):
    """The user trains a new backbone into the folder the index was built with (record and weights both new)."""
    bb = copy(ctx.base / "BB", wd / "bb")
    idx = wd / "idx"
    r = ctx.foco(["index", "build", "--images", ctx.base / "IMG", "--backbone", f"world:{bb}", "--out", idx])
    if r.rc != 0:
        return Res(None, skipped="index build with the other backbone failed: " + significant(r.err)[:150])
    clean = search_rows(ctx.foco(_search(idx, "--method", "sum", ref=ctx.base / "IMG/test-sg000003.png")))
    asset = ctx.repo / "src/foco/assets/world_backbone"
    for name in ("config.json", "model.safetensors", "metrics.json"):
        (bb / name).unlink(missing_ok=True)
        shutil.copy2(asset / name, bb / name)
    r = ctx.foco(_search(idx, "--method", "sum", ref=ctx.base / "IMG/test-sg000003.png"))
    if r.rc == 0:
        r.same = search_rows(r) == clean
        r.note = "" if r.same else "search results differ from those before the backbone was replaced"
    return r


@case(1, "train with --decompositions written from another world", "error",
      names=("--decompositions", "DW2.sqlite", "world", "store"))
def c1_train_decompositions_other_world(ctx, wd):
    return ctx.foco(["train", "--features", ctx.base / "F/train", "--world", ctx.base / "W", "--decompositions",
                     ctx.base / "DW2.sqlite", "--decomposer", "oracle", "--out", wd / "o", *TRAIN], timeout=300)


@case(1, "eval: the test-single cache is a copy of the val-single cache", "error",
      names=("test-single", "val/single", "val-single", "split", "--features"))
def c1_eval_val_cache_as_test(ctx, wd):
    f = wd / "F"
    copy(ctx.base / "F/val-single", f / "test-single")
    copy(ctx.base / "F/test-multi", f / "test-multi")
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", feats=f)


@case(1, "index update with index.json's backbone_sha256 gone", "error",
      names=("index.json", "backbone_sha256", "weights", "unverified"))
def c1_index_update_lost_sha(ctx, wd):
    idx = copy(ctx.base / "IDX", wd / "idx")
    jedit(idx / "index.json", lambda m: [m.pop("backbone_sha256"), None][1])  # the record edited, not replaced
    r = ctx.foco(["index", "update", idx])
    if r.rc == 0:
        r.note = f"index.json after update: backbone_sha256 = {jload(idx / 'index.json').get('backbone_sha256')}"
    return r


@case(1, "features extract rerun into a finished cache with another backbone", "error",
      names=("backbone", "world:pretrained"))
def c1_extract_resume_other_backbone(ctx, wd):
    f = copy(ctx.base / "F/test-single", wd / "f")
    r = ctx.foco(["features", "extract", "--backbone", f"world:{ctx.base / 'BB'}", "--world", ctx.base / "W",
                  "--split", "test/single", "--out", f])
    if r.rc == 0:
        m = jload(f / "manifest.json")
        r.note = f"manifest now says backbone {m.get('backbone')}"
    return r


# =================================================================================================== 2 content hashes

def _swap_texts_shard(ctx, f: Path):
    for ext in ("safetensors", "json"):
        (f / "texts" / f"shard-00000.{ext}").unlink()
        shutil.copy2(ctx.base / "FBB/test-single/texts" / f"shard-00000.{ext}", f / "texts" / f"shard-00000.{ext}")


@case(2, "features verify: texts shard and record copied from another backbone's cache", "error",
      names=("texts", "shard-00000", "fingerprint", "manifest", "--cache"))
def c2_verify_texts_shard_swapped(ctx, wd):
    f = copy(ctx.base / "F/test-single", wd / "f")
    _swap_texts_shard(ctx, f)
    return ctx.foco(["features", "verify", "--cache", f])


@case(2, "eval: texts shard and record copied from another backbone's cache", "error_or_same",
      names=("texts", "shard-00000", "fingerprint", "manifest", "test-single", "--features"))
def c2_eval_texts_shard_swapped(ctx, wd):
    f = wd / "F"
    copy(ctx.base / "F/test-single", f / "test-single")
    copy(ctx.base / "F/test-multi", f / "test-multi")
    _swap_texts_shard(ctx, f / "test-single")
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", feats=f)


@case(2, "eval: one bit flipped in an images shard's patches", "error_or_same",
      names=("shard-00000", "sha256", "images", "test-single", "--features"))
def c2_eval_bit_flip(ctx, wd):
    f = wd / "F"
    copy(ctx.base / "F/test-single", f / "test-single")
    copy(ctx.base / "F/test-multi", f / "test-multi")
    st_flip(f / "test-single/images/shard-00000.safetensors", "global", at=0.3)
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", feats=f)


@case(2, "eval: two queries' targets swapped in queries.jsonl (world.json not updated)", "error_or_same",
      names=("queries.jsonl", "sha256", "manifest", "world verify", "--root"))
def c2_eval_queries_targets_swapped(ctx, wd):
    w = clone_world(ctx, wd / "w")

    def swap(rows):
        rows[0]["target"], rows[1]["target"] = rows[1]["target"], rows[0]["target"]
    edit_jsonl(w / "benchmarks/test/single/queries.jsonl", swap)
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", world=w)


@case(2, "features extract: two gallery entries' image paths swapped (world.json not updated)", "error_or_same",
      names=("gallery.jsonl", "sha256", "manifest", "world verify", "--world"))
def c2_extract_gallery_paths_swapped(ctx, wd):
    w = clone_world(ctx, wd / "w")

    def swap(rows):
        rows[0]["image"], rows[1]["image"] = rows[1]["image"], rows[0]["image"]
    edit_jsonl(w / "benchmarks/test/single/gallery.jsonl", swap)
    out = wd / "f"
    r = ctx.foco(["features", "extract", "--backbone", "world:pretrained", "--world", w, "--split", "test/single",
                  "--out", out])
    if r.rc == 0:
        r.same = cache_digest(out) == ctx.clean["cache_test_single"]
    return r


@case(2, "train: two pairs' oracle decompositions swapped in pairs/train.jsonl (world.json not updated)",
      "error_or_same", names=("train.jsonl", "sha256", "manifest", "world verify", "--world"))
def c2_train_decompositions_swapped(ctx, wd):
    w = clone_world(ctx, wd / "w")

    def swap(rows):
        rows[3]["decomposition"], rows[4]["decomposition"] = rows[4]["decomposition"], rows[3]["decomposition"]
    edit_jsonl(w / "pairs/train.jsonl", swap)
    r = ctx.foco(["train", "--features", ctx.base / "F/train", "--world", w, "--out", wd / "o", *TRAIN, "--seed", "0"],
                 timeout=300)
    if r.rc == 0:
        r.same = st_tensors(wd / "o/foco.safetensors") == ctx.clean["ck"]
    return r


@case(2, "eval: foco.safetensors replaced by another run's (same shapes)", "error_or_same",
      names=("foco.safetensors", "sha256", "weights", "--checkpoint"))
def c2_eval_ckpt_weights_swapped(ctx, wd):
    ck = copy(ctx.base / "CK", wd / "ck")
    (ck / "foco.safetensors").unlink()
    shutil.copy2(ctx.base / "CK1/foco.safetensors", ck / "foco.safetensors")
    return eval_case(ctx, wd, "foco", "eval_foco", "--checkpoint", ck)


@case(2, "search: two rows of the index's stored vectors swapped (vectors/shard-00000.f32)", "error_or_same",
      names=("shard-00000.f32", "vectors", "sha256", "--index"))
def c2_search_vector_rows_swapped(ctx, wd):
    idx = copy(ctx.base / "IDX", wd / "idx")
    f = idx / "vectors/shard-00000.f32"
    raw = bytearray(f.read_bytes())
    d = jload(idx / "index.json")["dim"] * 4
    raw[2 * d:3 * d], raw[3 * d:4 * d] = raw[3 * d:4 * d], raw[2 * d:3 * d]
    f.unlink()
    f.write_bytes(bytes(raw))
    return search_case(ctx, "search_sum", idx, "--method", "sum")


@case(2, "search: two ids swapped in the FAISS id map of vectors.faiss", "error_or_same",
      names=("vectors.faiss", "sha256", "index", "--index"))
def c2_search_faiss_ids_swapped(ctx, wd):
    idx = copy(ctx.base / "IDX", wd / "idx")
    f = idx / "vectors.faiss"
    raw = bytearray(f.read_bytes())
    n = jload(idx / "index.json")["count"]
    base = len(raw) - 8 * n       # IndexIDMap: the int64 ids close the file
    i, j = base + 8 * 4, base + 8 * 10
    raw[i:i + 8], raw[j:j + 8] = raw[j:j + 8], raw[i:i + 8]
    f.unlink()
    f.write_bytes(bytes(raw))
    return search_case(ctx, "search_path", idx, "--method", "sum", ref=ctx.base / "IMG/test-sg000003.png")


@case(2, "eval: two lines of test/multi gallery.jsonl reordered (world.json not updated)", "error_or_same",
      names=("gallery.jsonl", "sha256", "manifest", "world verify", "--root", "--features", "gallery of test/multi"))
def c2_eval_gallery_lines_reordered(ctx, wd):
    w = clone_world(ctx, wd / "w")

    def swap(rows):
        rows[5], rows[6] = rows[6], rows[5]
    edit_jsonl(w / "benchmarks/test/multi/gallery.jsonl", swap)
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", world=w)


@case(2, "eval: the texts shards of test-single and test-multi swapped, each with its record", "error_or_same",
      names=("texts", "shard-00000", "fingerprint", "manifest", "test-single", "test-multi", "--features"))
def c2_eval_texts_shards_swapped_between_caches(ctx, wd):
    f = wd / "F"
    copy(ctx.base / "F/test-single", f / "test-single")
    copy(ctx.base / "F/test-multi", f / "test-multi")
    for ext in ("safetensors", "json"):
        a, b = f / "test-single/texts" / f"shard-00000.{ext}", f / "test-multi/texts" / f"shard-00000.{ext}"
        tmp = wd / f"tmp.{ext}"
        a.rename(tmp)
        b.rename(a)
        tmp.rename(b)
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", feats=f)


# ============================================================================================================ 3 numbers

@case(3, "search -k with 20 digits", "error", names=("-k", "--k"))
def c3_search_k_huge(ctx, wd):
    return ctx.foco(_search(ctx.base / "IDX", "--method", "sum", k="99999999999999999999"))


@case(3, "search --box inverted (x0 > x1)", "error", names=("--box", "40,40,10,10", "40, 40, 10, 10"))
def c3_search_box_inverted(ctx, wd):
    return ctx.foco(_search(ctx.base / "IDX", "--method", "foco", "--checkpoint", ctx.base / "CK",
                            "--box", "40,40,10,10"))


@case(3, "search --box-beta -1e308 (largest negative)", "error_or_same", names=("--box-beta",))
def c3_search_box_beta_neg_huge(ctx, wd):
    r = ctx.foco(_search(ctx.base / "IDX", "--method", "foco", "--checkpoint", ctx.base / "CK",
                         "--box", "0,0,32,32", "--box-beta=-1e308"))
    if r.rc == 0:   # no clean run to equal: a legitimate answer has k finite scores
        rows = search_rows(r)
        r.same = rows_finite(rows, 5)
        r.note = "k finite scores" if r.same else f"not k finite scores: {json.dumps(rows)[:120]}"
    return r


@case(3, "eval --chord 100.5 (documented 0-100)", "error", names=("--chord",))
def c3_eval_chord_above_range(ctx, wd):
    return eval_case(ctx, wd, "sum", "eval_sum", "--chord", "100.5")


@case(3, "eval --chord-shortlist -10", "error", names=("--chord-shortlist",))
def c3_eval_chord_shortlist_negative(ctx, wd):
    return eval_case(ctx, wd, "sum", "eval_sum", "--chord", "0.5", "--chord-shortlist", "-10")


@case(3, "train --lr-stage1 1e308", "error", names=("--lr-stage1", "lr_stage1", "non-finite", "not finite"))
def c3_train_lr_huge(ctx, wd):
    r = ctx.foco(["train", "--features", ctx.base / "F/train", "--world", ctx.base / "W", "--out", wd / "o",
                  *TRAIN, "--lr-stage1", "1e308"], timeout=300)
    if r.rc == 0:
        r.note = "trained to the end with lr 1e308"
    return r


@case(3, "train --batch-size 10**25", "error", names=("--batch-size", "batch_size"))
def c3_train_batch_huge(ctx, wd):
    return ctx.foco(["train", "--features", ctx.base / "F/train", "--world", ctx.base / "W", "--out", wd / "o",
                     "--stage1-epochs", "1", "--stage2-epochs", "0", "--batch-size", "1" + "0" * 25], timeout=300)


@case(3, "index build --index-type auto --max-index-memory nanGB", "error", names=("--max-index-memory",))
def c3_index_memory_nan(ctx, wd):
    return ctx.foco(["index", "build", "--images", ctx.base / "IMG", "--backbone", "world:pretrained",
                     "--out", wd / "idx", "--index-type", "auto", "--max-index-memory", "nanGB"])


@case(3, "serve --max-text with 31 digits", "error", names=("--max-text",))
def c3_serve_max_text_huge(ctx, wd):
    return serve(ctx, ["serve", "--index", ctx.base / "IDX", "--max-text", "1" + "0" * 30])


# ======================================================================================================= 4 record files

@case(4, "eval: foco.json config.dim is the string \"256\"", "error_or_same",
      names=("foco.json", "config.dim", "--checkpoint"))
def c4_foco_json_dim_string(ctx, wd):
    ck = copy(ctx.base / "CK", wd / "ck")
    jedit(ck / "foco.json", lambda m: m["config"].__setitem__("dim", "256"))
    return eval_case(ctx, wd, "foco", "eval_foco", "--checkpoint", ck)


@case(4, "eval: foco.json config.heads 7 (does not divide dim 256)", "error",
      names=("foco.json", "heads", "--checkpoint"))
def c4_foco_json_heads_7(ctx, wd):
    ck = copy(ctx.base / "CK", wd / "ck")
    jedit(ck / "foco.json", lambda m: m["config"].__setitem__("heads", 7))
    return eval_case(ctx, wd, "foco", "eval_foco", "--checkpoint", ck)


@case(4, "eval: pic2word.json config.hidden_dim -512", "error", names=("pic2word.json", "hidden_dim", "--pic2word"))
def c4_p2w_hidden_negative(ctx, wd):
    p = copy(ctx.base / "P2W", wd / "p2w")
    jedit(p / "pic2word.json", lambda m: m["config"].__setitem__("hidden_dim", -512))
    return eval_case(ctx, wd, "pic2word", "eval_p2w", "--pic2word", p)


@case(4, "eval: feature manifest.json embed_dim 128 (tensors are 256 wide)", "error_or_same",
      names=("manifest.json", "embed_dim", "--features"))
def c4_manifest_embed_dim(ctx, wd):
    f = wd / "F"
    copy(ctx.base / "F/test-single", f / "test-single")
    copy(ctx.base / "F/test-multi", f / "test-multi")
    jedit(f / "test-single/manifest.json", lambda m: m.__setitem__("embed_dim", 128))
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", feats=f)


@case(4, "eval: feature manifest.json texts.count NaN", "error_or_same",
      names=("manifest.json", "texts.count", "--features"))
def c4_manifest_count_nan(ctx, wd):
    f = wd / "F"
    copy(ctx.base / "F/test-single", f / "test-single")
    copy(ctx.base / "F/test-multi", f / "test-multi")
    jedit(f / "test-multi/manifest.json", lambda m: m["texts"].__setitem__("count", float("nan")))
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", feats=f)


@case(4, "features extract: world.json image_size -64", "error_or_same", names=("world.json", "image_size", "--world"))
def c4_world_image_size_negative(ctx, wd):
    w = clone_world(ctx, wd / "w")
    jedit(w / "world.json", lambda m: m.__setitem__("image_size", -64))
    out = wd / "f"
    r = ctx.foco(["features", "extract", "--backbone", "world:pretrained", "--world", w, "--split", "test/single",
                  "--out", out])
    if r.rc == 0:
        r.same = cache_digest(out) == ctx.clean["cache_test_single"]
    return r


@case(4, "search: index.json count -5", "error_or_same", names=("index.json", "--index"))
def c4_index_count_negative(ctx, wd):
    idx = copy(ctx.base / "IDX", wd / "idx")
    jedit(idx / "index.json", lambda m: m.__setitem__("count", -5))
    return search_case(ctx, "search_sum", idx, "--method", "sum")


@case(4, "search: index.json dim is the string \"256\"", "error_or_same", names=("index.json", "--index"))
def c4_index_dim_string(ctx, wd):
    idx = copy(ctx.base / "IDX", wd / "idx")
    jedit(idx / "index.json", lambda m: m.__setitem__("dim", "256"))
    return search_case(ctx, "search_sum", idx, "--method", "sum")


@case(4, "train rerun: train_state/state.json cut in half", "error_or_same", names=("state.json", "train_state"))
def c4_state_json_truncated(ctx, wd):
    ck = copy(ctx.base / "CK", wd / "ck")
    s = ck / "train_state/state.json"
    raw = s.read_bytes()
    s.write_bytes(raw[:len(raw) // 2])
    r = ctx.foco(["train", "--features", ctx.base / "F/train", "--world", ctx.base / "W", "--out", ck, *TRAIN,
                  "--seed", "0"], timeout=300)
    if r.rc == 0:
        r.same = st_tensors(ck / "foco.safetensors") == ctx.clean["ck"]
    return r


@case(4, "search: images.sqlite overwritten with 8 KiB of zeros", "error", names=("images.sqlite", "--index"))
def c4_images_sqlite_zeros(ctx, wd):
    idx = copy(ctx.base / "IDX", wd / "idx")
    for side in ("images.sqlite-shm", "images.sqlite-wal"):
        (idx / side).unlink(missing_ok=True)
    (idx / "images.sqlite").write_bytes(b"\0" * 8192)
    return search_case(ctx, "search_sum", idx, "--method", "sum")


@case(4, "eval: an images shard record's ids is a string, not a list", "error",
      names=("shard-00000.json", "ids", "--features"))
def c4_shard_ids_string(ctx, wd):
    f = wd / "F"
    copy(ctx.base / "F/test-single", f / "test-single")
    copy(ctx.base / "F/test-multi", f / "test-multi")
    jedit(f / "test-multi/images/shard-00000.json", lambda m: m.__setitem__("ids", "test-mg000000"))
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", feats=f)


@case(4, "index build: world backbone config.json embed_dim \"big\"", "error",
      names=("config.json", "embed_dim", "--backbone"))
def c4_backbone_config_string(ctx, wd):
    bb = copy(ctx.base / "BB", wd / "bb")
    jedit(bb / "config.json", lambda m: m["config"].__setitem__("embed_dim", "big"))
    return ctx.foco(["index", "build", "--images", ctx.base / "IMG", "--backbone", f"world:{bb}", "--out", wd / "idx"])


def _corpus(ctx: Ctx) -> dict:
    """A feature corpus of the tiny world's train pairs (webdataset shards, rule decompositions), and a clean
    one-epoch FoCo run on it; made once."""
    b = ctx.base
    c = {"wds": b / "WDS", "store": b / "DC.sqlite", "corpus": b / "C", "ck": b / "CKC"}
    pattern = str(b / "WDS/{00000..00001}.tar")
    c["pattern"] = pattern
    if not c["ck"].exists():
        ctx.must(["world", "export", "--world", b / "W", "--format", "webdataset", "--split", "train",
                  "--shard-size", "300", "--out", c["wds"]])
        ctx.must(["decompose", "--in", pattern, "--out", c["store"]])
        ctx.must(["features", "extract", "--backbone", "world:pretrained", "--in", pattern, "--with-captions",
                  "--decompositions", c["store"], "--decomposer", "rule", "--out", c["corpus"]])
        ctx.must(["train", "--features", c["corpus"], "--in", pattern, "--decompositions", c["store"],
                  "--decomposer", "rule", "--out", c["ck"], *TRAIN, "--seed", "0"], timeout=300)
    return c


@case(4, "train: corpus.json lists one part twice (parts [00000, 00000])", "error_or_same",
      names=("corpus.json", "parts", "--features"))
def c4_corpus_part_twice(ctx, wd):
    c = _corpus(ctx)
    corpus = copy(c["corpus"], wd / "c")
    jedit(corpus / "corpus.json", lambda m: m.__setitem__("parts", [m["parts"][0]] * len(m["parts"])))
    r = ctx.foco(["train", "--features", corpus, "--in", c["pattern"], "--decompositions", c["store"],
                  "--decomposer", "rule", "--out", wd / "o", *TRAIN, "--seed", "0"], timeout=300)
    if r.rc == 0:
        r.same = st_tensors(wd / "o/foco.safetensors") == st_tensors(c["ck"] / "foco.safetensors")
    return r


# ========================================================================================================= 5 text rules

@case(5, "search --text of a word joiner and a BOM only", "error", names=("--text", "text is", "empty"))
def c5_search_text_wj_bom(ctx, wd):
    return ctx.foco(_search(ctx.base / "IDX", "--method", "sum", text="\u2060\ufeff\u2060"))


@case(5, "search --text holding invalid UTF-8 bytes (a lone surrogate in argv)", "error",
      names=("--text", "text holds", "surrogate", "utf-8"))
def c5_search_text_bad_bytes(ctx, wd):
    return ctx.foco(_search(ctx.base / "IDX", "--method", "sum", text=b"make it \xff\xfe red"))


@case(5, "search --text of ideographic, no-break and em spaces only", "error",
      names=("--text", "text is", "empty"))
def c5_search_text_unicode_spaces(ctx, wd):
    return ctx.foco(_search(ctx.base / "IDX", "--method", "sum", text="\u3000 \u00a0\u2003"))


@case(5, "decompose: a JSONL caption of zero-width joiners only (line 2)", "error",
      names=("caps.jsonl", "line 2", ":2", "--in"))
def c5_decompose_zero_width_caption(ctx, wd):
    f = wd / "caps.jsonl"
    f.write_text("".join(json.dumps({"id": str(i), "caption": c}) + "\n" for i, c in enumerate(
        ["a red car next to a small dog", "\u200c\u200d\u200b", "a man riding a horse on the beach"])),
        encoding="utf-8")
    r = ctx.foco(["decompose", "--in", f, "--out", wd / "d.sqlite"])
    if r.rc == 0:
        rows = store_rows(wd / "d.sqlite", "decompositions", "caption")
        r.note = f"store holds {len(rows)} captions: {rows!r}"[:200]
    return r


@case(5, "decompose: a CSV saved with a UTF-8 BOM (Excel) equals the plain CSV", "same",
      names=("caps.csv", "caption"))
def c5_decompose_bom_csv(ctx, wd):
    f = wd / "caps.csv"
    f.write_bytes(b"\xef\xbb\xbf" + (ctx.base / "caps.csv").read_bytes())
    r = ctx.foco(["decompose", "--in", f, "--out", wd / "d.sqlite"])
    if r.rc == 0:
        r.same = store_rows(wd / "d.sqlite", "decompositions", "caption_hash, caption, record, flag") == \
            ctx.clean["dcsv"]
    return r


@case(5, "decompose: an invalid UTF-8 byte in a CSV row", "error", names=("caps.csv", "--in"))
def c5_decompose_csv_bad_byte(ctx, wd):
    f = wd / "caps.csv"
    f.write_bytes(b"id,caption\n0,a red car next to a small dog\n1,two cats on a \xe9 sofa\n"
                  b"2,a man riding a horse on the beach\n")
    return ctx.foco(["decompose", "--in", f, "--out", wd / "d.sqlite"])


@case(5, "eval: a world query's modification of zero-width characters only (manifest rehashed)", "error",
      names=("queries.jsonl", "modification", "empty", "--root"))
def c5_eval_world_zero_width_modification(ctx, wd):
    w = clone_world(ctx, wd / "w")
    rel = "benchmarks/test/single/queries.jsonl"
    edit_jsonl(w / rel, lambda rows: rows[2].__setitem__("modification", "\u200b\u2060\u200b"))
    world_rehash(w, rel)
    return eval_case(ctx, wd, "sum,image,text", "eval_sum", world=w)


@case(5, "decompose: a JSONL caption holding U+2028 (valid JSON, a line break) is one caption", "ok",
      names=("caps.jsonl",))
def c5_decompose_u2028(ctx, wd):
    f = wd / "caps.jsonl"
    caps = ["a red car next to a small dog", "two cats on a sofa\u2028with a blue pillow",
            "a man riding a horse on the beach"]
    f.write_text("".join(json.dumps({"id": str(i), "caption": c}, ensure_ascii=False) + "\n"
                         for i, c in enumerate(caps)), encoding="utf-8")
    r = ctx.foco(["decompose", "--in", f, "--out", wd / "d.sqlite"])
    if r.rc == 0:
        n = len(store_rows(wd / "d.sqlite", "decompositions", "caption"))
        r.same = n == 3
        r.note = f"store holds {n} captions (3 lines)"
    return r


@case(5, "decompose: a JSONL file saved as UTF-16", "error", names=("caps.jsonl", "UTF-16", "utf-8", "UTF-8", "--in"))
def c5_decompose_utf16(ctx, wd):
    f = wd / "caps.jsonl"
    f.write_bytes((ctx.base / "caps.jsonl").read_text(encoding="utf-8").encode("utf-16"))
    return ctx.foco(["decompose", "--in", f, "--out", wd / "d.sqlite"])


@case(5, "eval CIRCO: a relative_caption of invisible operators only (U+2062, U+2063)", "error",
      names=("val.json", "relative_caption", "blank", "empty", "--root"))
def c5_circo_invisible_caption(ctx, wd):
    root = wd / "circo"
    r = ctx.foco(["world", "export", "--world", ctx.base / "W", "--format", "circo", "--split", "val", "--out", root])
    if r.rc != 0:
        return Res(None, skipped="world export --format circo failed: " + significant(r.err)[:150])
    jedit(root / "annotations/val.json", lambda rows: rows[3].__setitem__("relative_caption", "\u2062\u2063\u2062"))
    return ctx.foco(["eval", "--benchmark", "circo", "--root", root, "--split", "val", "--methods", "sum",
                     "--backbone", "world:pretrained", "--cache", wd / "cache", "--out", wd / "E.json"])


# ======================================================================================================= 6 write errors

def _full_disk(ctx: Ctx, wd: Path, size: str) -> tuple[Path | None, int | None]:
    """(mount point, None) for a small tmpfs; (folder, RLIMIT_FSIZE bytes) when mounting is not possible."""
    m = wd / "disk"
    if ctx.tmpfs(m, size):
        return m, None
    m.mkdir(parents=True, exist_ok=True)
    units = {"k": 1024, "m": 1024 ** 2}
    return m, int(size[:-1]) * units[size[-1]]


def _grow(ctx: Ctx, m: Path, fsize):
    if fsize is None:
        ctx.grow(m)


def _ro(ctx: Ctx, wd: Path) -> Path | None:
    m = wd / "ro"
    return m / "out" if ctx.tmpfs(m, "4m", ro=True) else None


@case(6, "pic2word train on a disk that fills at the final write", "error", names=("disk/p2w", "pic2word", "space"))
def c6_p2w_full(ctx, wd):
    m, fs = _full_disk(ctx, wd, "8m")
    ctx.state["p2w_full"] = (m, fs)
    return ctx.foco(["pic2word", "train", "--features", ctx.base / "F/train", "--out", m / "p2w", *P2W_ARGS,
                     "--seed", "0"], fsize=fs)


@case(6, "pic2word train rerun after the disk was freed (same mapper as a clean run)", "same",
      names=("disk/p2w", "pic2word"))
def c6_p2w_rerun(ctx, wd):
    if "p2w_full" not in ctx.state:
        return Res(None, skipped="needs the case before it")
    m, fs = ctx.state["p2w_full"]
    _grow(ctx, m, fs)
    r = ctx.foco(["pic2word", "train", "--features", ctx.base / "F/train", "--out", m / "p2w", *P2W_ARGS,
                  "--seed", "0"])
    if r.rc == 0:
        r.same = st_tensors(m / "p2w/pic2word.safetensors") == ctx.clean["p2w"]
    return r


def _by_path(rows) -> list:
    """Search rows as (path, score to 4 decimals): ids may be numbered otherwise after an update or a resume."""
    return [(x.get("path"), round(x.get("score", 0), 4)) for x in rows or []]


@case(6, "index update on a disk that fills while 150 new images are added", "error",
      names=("disk/idx", "images.sqlite", "vectors", "space"))
def c6_index_update_full(ctx, wd):
    m, fs = _full_disk(ctx, wd, "64m")
    img = copy(ctx.base / "IMG", wd / "img")
    r = ctx.foco(["index", "build", "--images", img, "--backbone", "world:pretrained", "--out", m / "idx"])
    if r.rc != 0:
        return Res(None, skipped="the first index build failed: " + significant(r.err)[:150])
    if fs is None:
        ctx.shrink(m, 48 * 1024)   # 48 KiB left: about a third of what 150 more images need
    else:
        fs = 48 * 1024             # no mount: RLIMIT_FSIZE, a file may not grow past 48 KiB
    for p in sorted((ctx.base / "W/images/test-single").glob("*.png"))[20:170]:
        shutil.copy2(p, img / p.name)
    ctx.state["idx_full"] = (m, fs, img)
    return ctx.foco(["index", "update", m / "idx"], fsize=fs)


@case(6, "index update rerun after the disk was freed (same results as a fresh build)", "same",
      names=("disk/idx",))
def c6_index_update_rerun(ctx, wd):
    if "idx_full" not in ctx.state:
        return Res(None, skipped="needs the case before it")
    m, fs, img = ctx.state["idx_full"]
    _grow(ctx, m, fs)
    r = ctx.foco(["index", "update", m / "idx"])
    if r.rc != 0:
        return r
    fresh = wd / "fresh"
    ctx.must(["index", "build", "--images", img, "--backbone", "world:pretrained", "--out", fresh])
    ref = img / "test-sg000003.png"
    a = ctx.foco(_search(m / "idx", "--method", "sum", ref=ref, k="10"))
    b = ctx.foco(_search(fresh, "--method", "sum", ref=ref, k="10"))
    if a.rc != 0:
        a.note = "the updated index does not search"
        return a
    count, want = jload(m / "idx/index.json").get("count"), jload(fresh / "index.json").get("count")
    r.same = _by_path(search_rows(a)) == _by_path(search_rows(b)) and count == want
    r.note = f"count {count} (fresh build {want}); by-path search {'equal' if r.same else 'differs'}"
    return r


@case(6, "decompose --out into a read-only folder", "error", names=("ro/out", "d.sqlite", "read-only"))
def c6_decompose_ro(ctx, wd):
    out = _ro(ctx, wd)
    if out is None:
        return Res(None, skipped="no read-only mount (not root)")
    return ctx.foco(["decompose", "--in", ctx.base / "caps.csv", "--out", out / "d.sqlite"])


@case(6, "features extract --out a read-only folder", "error", names=("ro/out", "read-only"))
def c6_extract_ro(ctx, wd):
    out = _ro(ctx, wd)
    if out is None:
        return Res(None, skipped="no read-only mount (not root)")
    return ctx.foco(["features", "extract", "--backbone", "world:pretrained", "--world", ctx.base / "W",
                     "--split", "test/multi", "--out", out])


@case(6, "eval --out under a path whose parent is a regular file", "error", names=("--out", "afile"))
def c6_eval_out_under_file(ctx, wd):
    (wd / "afile").write_text("not a folder\n")
    return ctx.foco(_eval(ctx.base / "W", ctx.base / "F", "sum", wd / "afile/r.json"))


@case(6, "edits generate on a 40 KiB disk", "error", names=("disk/ed.sqlite", "ed.sqlite", "space"))
def c6_edits_full(ctx, wd):
    m, fs = _full_disk(ctx, wd, "40k")
    ctx.state["ed_full"] = (m, fs)
    return ctx.foco(["edits", "generate", "--in", ctx.base / "W", "--split", "train", "--out", m / "ed.sqlite",
                     "--limit", "50"], fsize=fs)


@case(6, "edits generate rerun after the disk was freed (same triplets)", "same", names=("ed.sqlite",))
def c6_edits_rerun(ctx, wd):
    if "ed_full" not in ctx.state:
        return Res(None, skipped="needs the case before it")
    m, fs = ctx.state["ed_full"]
    _grow(ctx, m, fs)
    r = ctx.foco(["edits", "generate", "--in", ctx.base / "W", "--split", "train", "--out", m / "ed.sqlite",
                  "--limit", "50"])
    if r.rc == 0:
        r.same = store_rows(m / "ed.sqlite", "triplets", "source_id, i, kind, record") == ctx.clean["ed"]
    return r


# ============================================================================================== 7 state before logs

def _nlines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _compare_run(r: Res, out: Path, clean: Path, weights: str) -> Res:
    """A resumed run against an uninterrupted one: weights, epoch log and step log."""
    if r.rc != 0:
        return r
    diffs = []
    if st_tensors(out / weights) != st_tensors(clean / weights):
        diffs.append("weights differ")
    for log in ("train_log.jsonl", "train_steps.jsonl"):
        a, b = log_rows(out / log), log_rows(clean / log)
        if a != b:
            diffs.append(f"{log}: {len(a or [])} rows, uninterrupted {len(b or [])}")
    r.same = not diffs
    r.note = (r.note + "; " if r.note else "") + ("; ".join(diffs) if diffs else "weights and logs as uninterrupted")
    return r


def _clean_run(ctx: Ctx, key: str, args) -> Path:
    """An uninterrupted run, made once and shared by the cases that compare with it."""
    out = ctx.base / key
    if not out.exists():
        ctx.must([*args, "--out", out], timeout=400)
    return out


P2W3 = ["pic2word", "train", "--features", None, "--epochs", "3", "--batch-size", "128", "--seed", "0"]


def _p2w3(ctx):
    a = list(P2W3)
    a[3] = ctx.base / "F/train"
    return a


@case(7, "pic2word killed just after epoch 1 was logged, then rerun", "same", names=("/p2w",))
def c7_p2w_kill_after_log(ctx, wd):
    clean = _clean_run(ctx, "P2W3", _p2w3(ctx))
    out = wd / "p2w"
    how = run_and_kill(ctx, [*_p2w3(ctx), "--out", out], lambda: _nlines(out / "train_log.jsonl") >= 1)
    r = ctx.foco([*_p2w3(ctx), "--out", out], timeout=300)
    r.note = how
    return _compare_run(r, out, clean, "pic2word.safetensors")


@case(7, "pic2word killed in the middle of epoch 2, then rerun", "same", names=("/p2w",))
def c7_p2w_kill_mid_epoch(ctx, wd):
    clean = _clean_run(ctx, "P2W3", _p2w3(ctx))
    per_epoch = max(1, _nlines(clean / "train_steps.jsonl") // 3)
    out = wd / "p2w"
    how = run_and_kill(ctx, [*_p2w3(ctx), "--out", out],
                       lambda: _nlines(out / "train_steps.jsonl") >= per_epoch + max(1, per_epoch // 2))
    r = ctx.foco([*_p2w3(ctx), "--out", out], timeout=300)
    r.note = how
    return _compare_run(r, out, clean, "pic2word.safetensors")


def _foco2(ctx):
    return ["train", "--features", ctx.base / "F/train", "--world", ctx.base / "W", "--stage1-epochs", "2",
            "--stage2-epochs", "0", "--batch-size", "64", "--seed", "0"]


@case(7, "foco train killed 3 steps into epoch 2, then rerun", "same", names=("/ck",))
def c7_foco_kill_mid_epoch2(ctx, wd):
    clean = _clean_run(ctx, "CK2", _foco2(ctx))
    per_epoch = max(1, _nlines(clean / "train_steps.jsonl") // 2)
    out = wd / "ck"
    how = run_and_kill(ctx, [*_foco2(ctx), "--out", out],
                       lambda: _nlines(out / "train_steps.jsonl") >= per_epoch + 3)
    r = ctx.foco([*_foco2(ctx), "--out", out], timeout=300)
    r.note = how
    return _compare_run(r, out, clean, "foco.safetensors")


@case(7, "foco train killed in epoch 1, then rerun with --restart", "same", names=("/ck",))
def c7_foco_kill_restart(ctx, wd):
    clean = _clean_run(ctx, "CK2", _foco2(ctx))
    out = wd / "ck"
    how = run_and_kill(ctx, [*_foco2(ctx), "--out", out], lambda: _nlines(out / "train_steps.jsonl") >= 4)
    r = ctx.foco([*_foco2(ctx), "--out", out, "--restart"], timeout=300)
    r.note = how
    return _compare_run(r, out, clean, "foco.safetensors")


def _bb2(ctx):
    return ["backbone", "train", "--world", ctx.base / "W", "--epochs", "2", "--batch-size", "128", "--seed", "3"]


@case(7, "backbone train killed just after epoch 1 was logged, then rerun", "same", names=("/bb",))
def c7_backbone_kill_after_log(ctx, wd):
    clean = _clean_run(ctx, "BB2", _bb2(ctx))
    out = wd / "bb"
    how = run_and_kill(ctx, [*_bb2(ctx), "--out", out], lambda: _nlines(out / "train_log.jsonl") >= 1)
    r = ctx.foco([*_bb2(ctx), "--out", out], timeout=300)
    r.note = how
    return _compare_run(r, out, clean, "model.safetensors")


def _extract128(ctx):
    return ["features", "extract", "--backbone", "world:pretrained", "--world", ctx.base / "W", "--split",
            "test/single", "--shard-size", "128"]


@case(7, "features extract killed after its second images shard, then rerun", "same", names=("/f",))
def c7_extract_kill(ctx, wd):
    clean = _clean_run(ctx, "F128", _extract128(ctx))
    out = wd / "f"
    how = run_and_kill(ctx, [*_extract128(ctx), "--out", out], lambda: (out / "images/shard-00001.json").exists())
    r = ctx.foco([*_extract128(ctx), "--out", out])
    r.note = how
    if r.rc == 0:
        r.same = cache_digest(out) == cache_digest(clean)
        if not r.same:
            r.note += "; shards differ from an uninterrupted extraction"
    return r


@case(7, "index build over 372 images killed once vectors were written, then rerun", "same", names=("/idx",))
def c7_index_kill(ctx, wd):
    imgs = ctx.base / "W/images/test-single"
    clean = _clean_run(ctx, "IDX372", ["index", "build", "--images", imgs, "--backbone", "world:pretrained",
                                       "--batch-size", "16"])
    out = wd / "idx"

    def trig():
        return any(p.stat().st_size > 0 for p in (out / "vectors").glob("*")) if (out / "vectors").exists() else False
    how = run_and_kill(ctx, ["index", "build", "--images", imgs, "--backbone", "world:pretrained",
                             "--batch-size", "16", "--out", out], trig, poll=0.001)
    r = ctx.foco(["index", "build", "--images", imgs, "--backbone", "world:pretrained", "--batch-size", "16",
                  "--out", out])
    r.note = how
    if r.rc != 0:
        return r
    ra2 = ctx.foco(_search(out, "--method", "sum", ref=imgs / "test-sg000003.png"))
    rb2 = ctx.foco(_search(clean, "--method", "sum", ref=imgs / "test-sg000003.png"))
    count_a = jload(out / "index.json").get("count")
    want = jload(clean / "index.json").get("count")
    r.same = _by_path(search_rows(ra2)) == _by_path(search_rows(rb2)) and count_a == want
    r.note += f"; count {count_a}; by-path search {'equal' if r.same else 'differs'}"
    return r


# ================================================================================================ 8 ownership by kind

def _owned(ctx, wd, src: str, args_fn) -> Res:
    """Run a writing command into a copy of a base folder of another kind; note whether the folder changed."""
    folder = copy(ctx.base / src, wd / src.lower())
    before = folder_state(folder)
    r = ctx.foco(args_fn(folder), timeout=300)
    after = folder_state(folder)
    if after != before:
        added = sorted(set(after) - set(before))
        r.note = f"the folder changed ({len(added)} new or resized files, e.g. {[a[0] for a in added[:3]]})"
    return r


@case(8, "pic2word train --out an index folder", "error", names=("--out", "idx"),
      reason=("search index", "an index", "index folder", "index build"))
def c8_p2w_into_index(ctx, wd):
    return _owned(ctx, wd, "IDX", lambda f: ["pic2word", "train", "--features", ctx.base / "F/train", "--out", f,
                                             *P2W_ARGS])


@case(8, "foco train --out a Pic2Word folder", "error", names=("--out", "p2w"), reason=("pic2word", "mapper"))
def c8_train_into_p2w(ctx, wd):
    return _owned(ctx, wd, "P2W", lambda f: ["train", "--features", ctx.base / "F/train", "--world",
                                             ctx.base / "W", "--out", f, *TRAIN])


@case(8, "backbone train --out a feature cache", "error", names=("--out", "test-single"),
      reason=("feature cache", "features"))
def c8_backbone_into_cache(ctx, wd):
    return _owned(ctx, wd / "x", "F/test-single", lambda f: ["backbone", "train", "--world", ctx.base / "W",
                                                             "--out", f, "--epochs", "1", "--batch-size", "128"])


@case(8, "features extract --out a FoCo checkpoint folder", "error", names=("--out", "ck"),
      reason=("checkpoint", "foco train"))
def c8_extract_into_ckpt(ctx, wd):
    return _owned(ctx, wd, "CK", lambda f: ["features", "extract", "--backbone", "world:pretrained", "--world",
                                            ctx.base / "W", "--split", "test/multi", "--out", f])


@case(8, "decompose --out an index's images.sqlite", "error", names=("images.sqlite", "--out"),
      reason=("index", "not a decomposition store"))
def c8_decompose_into_index_db(ctx, wd):
    idx = copy(ctx.base / "IDX", wd / "idx")
    before = store_rows(idx / "images.sqlite", "sqlite_master", "type, name")
    r = ctx.foco(["decompose", "--in", ctx.base / "caps.csv", "--out", idx / "images.sqlite"])
    after = store_rows(idx / "images.sqlite", "sqlite_master", "type, name")
    if after != before:
        r.note = f"tables added to the index's database: {sorted(set(after) - set(before))}"[:200]
    return r


@case(8, "decompose --out an edit store", "error", names=("ed.sqlite", "--out"),
      reason=("edit", "not a decomposition store"))
def c8_decompose_into_edit_store(ctx, wd):
    ed = copy(ctx.base / "ED.sqlite", wd / "ed.sqlite")
    before = store_rows(ed, "sqlite_master", "type, name")
    r = ctx.foco(["decompose", "--in", ctx.base / "caps.csv", "--out", ed])
    after = store_rows(ed, "sqlite_master", "type, name")
    if after != before:
        r.note = f"tables added to the edit store: {sorted(set(after) - set(before))}"[:200]
    return r


@case(8, "world generate --out an index folder", "error", names=("--out", "idx"),
      reason=("search index", "an index", "index folder", "index build"))
def c8_world_into_index(ctx, wd):
    return _owned(ctx, wd, "IDX", lambda f: ["world", "generate", "--out", f, "--size", "tiny"])


@case(8, "index build --out a world folder", "error", names=("--out", "/w"),
      reason=("a world", "world folder", "'world'", "world generate"))
def c8_index_into_world(ctx, wd):
    w = clone_world(ctx, wd / "w")
    before = folder_state(w)
    r = ctx.foco(["index", "build", "--images", ctx.base / "IMG", "--backbone", "world:pretrained", "--out", w])
    if folder_state(w) != before:
        r.note = "the world folder changed"
    return r


# ================================================================================================================ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, type=Path, help="a checkout whose src goes first on PYTHONPATH")
    ap.add_argument("--out", required=True, type=Path, help="JSON report")
    ap.add_argument("--python", default="/work/main/.venv/bin/python", help="interpreter that runs foco")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default /tmp/probe42-run-<time>)")
    ap.add_argument("--only", default=None, help="run only cases whose name holds one of these comma-separated parts")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every foco command")
    a = ap.parse_args(argv)
    repo = a.repo.resolve()
    if not (repo / "src/foco").is_dir():
        ap.error(f"--repo {repo}: no src/foco there")
    work = (a.work or Path(f"/tmp/probe42-run-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    work.mkdir(parents=True, exist_ok=False)
    ctx = Ctx(repo, a.python, work, a.verbose)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--short", "src"], capture_output=True,
                           text=True).stdout.strip()
    print(f"probe of issue 42 on {repo} (commit {commit}{', src modified' if dirty else ''}); work {work}", flush=True)
    t0 = time.monotonic()
    results = []
    try:
        build(ctx)
        sel = [c for c in CASES if not a.only or any(s in c.name for s in a.only.split(","))]
        for i, c in enumerate(sel, 1):
            wd = work / "cases" / f"{c.cls}-{i:02d}"
            wd.mkdir(parents=True)
            t = time.monotonic()
            try:
                r = c.fn(ctx, wd)
            except Exception as e:  # a fault of the probe itself, not of foco
                r = Res(None, skipped=f"probe error: {type(e).__name__}: {e}"[:300])
            if r.skipped:
                outcome, detail = "skipped", r.skipped
            else:
                outcome, detail = classify(c, r)
            results.append({"class": CLASSES[c.cls], "case": c.name, "expect": c.expect, "outcome": outcome,
                            "refused_legitimate": outcome == "clear error" and c.expect in ("ok", "same"),
                            "detail": detail.replace("\n", " | ")[:200], "stderr_head": r.err[:200] if r.err else "",
                            "rc": r.rc, "seconds": round(time.monotonic() - t, 1)})
            print(f"[{i:2d}/{len(sel)}] {CLASSES[c.cls]:<22} {outcome:<12} {c.name}  ({time.monotonic() - t:.1f}s)",
                  flush=True)
    finally:
        ctx.unmount_all()
    counts: dict = {}
    for r in results:
        counts.setdefault(r["class"], {o: 0 for o in (*OUTCOMES, "skipped")})[r["outcome"]] += 1
    total = {o: sum(c[o] for c in counts.values()) for o in (*OUTCOMES, "skipped")}
    report = {"repo": str(repo), "commit": commit, "src_modified": bool(dirty), "python": a.python,
              "work": str(work), "seconds": round(time.monotonic() - t0, 1), "cases": results,
              "counts": counts, "total": total}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    cols = [*OUTCOMES] + (["skipped"] if total["skipped"] else [])
    lines = ["", f"## issue 42 probe: {repo} ({commit}), {len(results)} cases, {report['seconds']:.0f}s", "",
             "| class | cases | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for k in CLASSES.values():
        if k in counts:
            lines.append(f"| {k} | {sum(counts[k].values())} | " + " | ".join(str(counts[k][o]) for o in cols) + " |")
    lines.append(f"| **all** | **{len(results)}** | " + " | ".join(f"**{total[o]}**" for o in cols) + " |")
    lines += ["", "| class | case | outcome | detail |", "|---|---|---|---|"]
    for r in results:
        d = r["detail"].replace("|", "\\|")[:140]
        lines.append(f"| {r['class']} | {r['case']} | {r['outcome']} | {d} |")
    print("\n".join(lines))
    print(f"\nreport in {a.out}")
    if not a.keep:
        shutil.rmtree(work / "cases", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
