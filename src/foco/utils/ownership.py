"""Write only into what foco owns.

Every folder a foco command writes holds `.foco-owner.json`: the command that claimed it and, for folders whose
files share names with a dataset's (exports), every file foco wrote there. The rules:

- a new or empty folder is claimed;
- a folder foco claimed before, or one an earlier foco wrote (it holds the command's signature file, e.g. a
  world's world.json, a cache's manifest.json), is foco's: the command resumes or updates it;
- any other non-empty folder is refused, naming a few of its files, unless `--force` is given: then foco writes
  its outputs beside them;
- a named output that exists but foco did not write (not listed in the owner file) is refused unless `--force`,
  so that an export pointed at a real dataset folder never replaces its annotations;
- a folder holds one kind of artifact (`KINDS`: a world, a FoCo checkpoint, a feature cache, ...), which its owner
  file records; a command writes only into its own kind, and a folder of another kind is refused for that reason,
  with or without `--force` (a folder an older foco wrote, without a recorded kind, is known by its files).

No command deletes or rewrites a file outside its own outputs, with or without `--force`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

MARKER = ".foco-owner.json"


def _own(name: str) -> bool:
    """The owner file, or a temporary copy of it a kill may leave mid-write (one per process: `_write`)."""
    return name == MARKER or (name.startswith(f".{MARKER}.") and name.endswith(".tmp"))

# Each kind of output folder and the files by which a folder of that kind is recognised (`owned`'s signatures,
# without what several kinds share, such as a training state).
KINDS: dict[str, tuple[str, ...]] = {
    "world": ("world.json:counts", ".generating.json"),
    "FoCo checkpoint": ("foco.json:model",),
    "Pic2Word mapper": ("pic2word.json:model",),
    "LinCIR phi": ("lincir.json:model",),
    "SEARLE phi": ("searle.json:model",),
    "Context-I2W mapper": ("context_i2w.json:model",),
    "SEARLE OTI tokens": ("oti.json:model", ".oti-progress.json"),
    "TAT adapters": ("tat.json:adapter_sha256",),
    "text composer (PACT, TSCIR)": ("composer.json:mapper",),
    "world backbone": ("config.json:weights_sha256",),
    "feature cache": ("manifest.json:shard_size", "corpus.json:parts"),
    "search index": ("index.json:format_version",),
    "ablation run": ("ablate.json", "ablations.json"),
    "quickstart run": ("backbone.json:backbone", "world/world.json:counts"),
    "world export": ("world_export.*.json",),
}


# What a training command writes into its --out (every trainer's kind): all that `--restart` may remove. A trainer
# that writes another name must list it here (tests/test_command_rules.py checks every trainer's folder).
RUN_OUTPUTS = ("train_state", "train_log.jsonl", "train_steps.jsonl", "loss_curve.png", "val_curve.jsonl",
               "edit-features", "targets_check.json", "foco.json", "foco.safetensors", "pic2word.json",
               "pic2word.safetensors", "lincir.json", "lincir.safetensors", "searle.json", "searle.safetensors",
               "oti.json", "oti.safetensors", "oti.partial.safetensors", ".oti-progress.json", "phrases.json",
               "context_i2w.json", "context_i2w.safetensors",
               "tat.json", "tat.safetensors",
               "composer.json", "composer.safetensors", "mapper.safetensors", "text.safetensors", "adafocal.json",
               "model.safetensors", "config.json", "metrics.json", "cache", ".*.tmp")

CONTAINERS = ("quickstart run", "ablation run")  # kinds whose folders hold other artifacts (a world, caches, ...)


def folder_kind(folder: str | Path) -> str | None:
    """The kind of artifact `folder` holds: the one its owner file records, else the one its files show (a folder
    an older foco wrote), else None (empty, or nothing foco knows)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    recorded = _read(folder).get("kind")
    if isinstance(recorded, str) and recorded in KINDS:
        return recorded
    return next((kind for kind, sigs in KINDS.items() if any(_matches(folder, s) for s in sigs)), None)


def check_kind(folder: str | Path, kind: str, command: str, flag: str = "--out",
               inside: tuple[Path, ...] = ()) -> None:
    """Refuses a `folder` of foco's that holds another kind of artifact than `kind`, the one `command` writes: the
    true reason, before anything is written (`--force` does not lift it: foco never mixes two artifacts in a
    folder). A user's folder that foco wrote into with --force stays the user's: `check_folder` speaks for it."""
    if kind not in KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}; known: {', '.join(KINDS)}")
    for parent in Path(folder).resolve().parents:  # an artifact is never written inside another one
        if parent in inside:  # but for the command's own output (a trainer's OUT/edit-features)
            continue
        outer = folder_kind(parent)
        if outer is not None and outer not in CONTAINERS and outer != kind:
            raise FileExistsError(f"{flag} {folder} is inside {parent}, which holds a {outer}; `foco {command}` "
                                  f"writes a {kind}, never inside another artifact: choose an {flag} outside it")
    meta = _read(Path(folder))
    if meta and not meta.get("command"):  # a user's folder, written into with --force
        return
    have = folder_kind(folder)
    if have is not None and have != kind:
        writer = _read(Path(folder)).get("command")
        by = f" (written by `foco {writer}`)" if writer else ""
        raise FileExistsError(f"{flag} {folder} holds a {have}{by}; `foco {command}` writes a {kind}: choose another "
                              f"{flag}")


def _read(folder: Path) -> dict:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def owned(folder: str | Path, signature: Iterable[str] = ()) -> bool:
    """Whether a foco command claimed `folder` (its owner file names one), or an earlier foco wrote it (it holds
    one of the `signature` files). An owner file that only lists outputs written into a shared folder (submission
    files beside results, a folder entered with --force) claims nothing.

    A signature is a name foco alone writes ("train_state"), a glob ("world_export.*.json"), or "FILE:KEY": a JSON
    object FILE holding KEY ("config.json:weights_sha256" is a world backbone's config, not a Hugging Face one)."""
    folder = Path(folder)
    return bool(_read(folder).get("command")) or any(_matches(folder, s) for s in signature)


def _matches(folder: Path, signature: str) -> bool:
    name, _, key = signature.partition(":")
    paths = list(folder.glob(name)) if any(c in name for c in "*?[") else [folder / name]
    for path in paths:
        if not path.exists():
            continue
        if not key:
            return True
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and key in data:
            return True
    return False


def claim_folder(folder: str | Path, command: str, signature: Iterable[str] = (), force: bool = False,
                 flag: str = "--out") -> Path:
    """Claims `folder` for `command` (creating it), or refuses a non-empty folder foco did not write (module
    docstring). Returns the folder."""
    foreign = not is_empty_or_owned(folder, signature)
    folder = check_folder(folder, signature, force, flag)
    if not foreign:  # a folder entered with --force stays the user's: the next command needs --force again
        mark_folder(folder, command)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def is_empty_or_owned(folder: str | Path, signature: Iterable[str] = ()) -> bool:
    """Whether `folder` is missing, empty (but for the owner file) or foco's (`owned`)."""
    folder = Path(folder)
    if not folder.is_dir():
        return True
    return not [p for p in folder.iterdir() if not _own(p.name)] or owned(folder, signature)


def mark_folder(folder: str | Path, command: str, kind: str | None = None) -> None:
    """Writes the owner file into an existing `folder` that has none (after a command created it), with the kind
    of artifact it holds; an owner file without a kind gets `kind`."""
    from .io import _write_failed
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        meta = _read(folder)
        if not meta.get("command"):
            _write(folder, {"owner": "foco", "files": [], **meta, "command": command,
                            **({"kind": kind} if kind else {})})
        elif kind and not meta.get("kind"):
            _write(folder, {**meta, "kind": kind})
    except OSError as exc:
        raise _write_failed(folder / MARKER, exc) from None


def check_folder(folder: str | Path, signature: Iterable[str] = (), force: bool = False, flag: str = "--out"
                 ) -> Path:
    """Refuses a non-empty `folder` that foco did not write, unless `force`; writes nothing."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{flag} {folder} is a file, not a folder; choose another {flag}")
    if folder.is_dir():
        foreign = [p.name for p in sorted(folder.iterdir()) if not _own(p.name)]
        if foreign and not owned(folder, signature) and not force:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise FileExistsError(f"{flag} {folder} holds files foco did not write ({shown}); choose a new or empty "
                                  f"{flag}, or pass --force to write foco's outputs beside them (nothing else in "
                                  "it is touched)")
    return folder


def enter_foreign(folder: str | Path) -> None:
    """Records, in a user's `folder` entered with --force, the names it held before foco wrote there: they stay the
    user's (the owner file names no command, so the folder is never taken for foco's), and `removable` never lists
    them."""
    folder = Path(folder)
    meta = _read(folder)
    if meta.get("command") or "user_files" in meta:  # recorded when foco first entered: later entries keep it
        return
    held = {p.name for p in folder.iterdir() if not _own(p.name)} if folder.is_dir() else set()
    _write(folder, {"owner": "user", "files": meta.get("files", []), **meta,
                    "user_files": sorted(set(meta.get("user_files", [])) | (held - set(meta.get("files", []))))})


def removable(folder: str | Path, patterns: Iterable[str] = RUN_OUTPUTS) -> list[Path]:
    """What a restart may remove from `folder`: the entries named by `patterns` (what a trainer writes), never the
    owner file nor a file the user held there before foco entered it with --force."""
    from fnmatch import fnmatch
    folder = Path(folder)
    if not folder.is_dir():
        return []
    users = set(_read(folder).get("user_files", []))
    return [p for p in sorted(folder.iterdir()) if not _own(p.name) and p.name not in users
            and any(fnmatch(p.name, pat) for pat in patterns)]


def record_inputs(folder: str | Path, inputs: dict) -> None:
    """Records in `folder`'s owner file what its artifact was made from ({flag: {"world": fingerprint, ...}}), so
    that a rerun reading other inputs is refused (`foco.cli.rules`)."""
    folder = Path(folder)
    meta = _read(folder)
    if meta:
        _write(folder, {**meta, "inputs": inputs})


def recorded_inputs(folder: str | Path) -> dict:
    """What `record_inputs` recorded ({} for a folder an older foco wrote)."""
    got = _read(Path(folder)).get("inputs")
    return got if isinstance(got, dict) else {}


def check_outputs(folder: str | Path, outputs: Iterable[str | Path], force: bool = False,
                  flag: str = "--out") -> None:
    """Refuses to replace an existing file among `outputs` (paths in `folder`) that foco did not write there."""
    folder = Path(folder)
    mine = set(_read(folder).get("files", []))
    theirs = sorted({Path(p).relative_to(folder).as_posix() for p in outputs
                     if Path(p).is_file() and Path(p).relative_to(folder).as_posix() not in mine})
    if theirs and not force:
        shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
        raise FileExistsError(f"{flag} {folder} already holds {shown}, which foco did not write; choose another "
                              f"{flag}, or pass --force to replace them")


def record_outputs(folder: str | Path, outputs: Iterable[str | Path]) -> None:
    """Lists `outputs` in the folder's owner file as written by foco."""
    folder = Path(folder)
    meta = _read(folder) or {"owner": "foco", "files": []}
    meta["files"] = sorted(set(meta.get("files", [])) | {Path(p).relative_to(folder).as_posix() for p in outputs})
    _write(folder, meta)


def _write(folder: Path, meta: dict) -> None:
    tmp = folder / f".{MARKER}.{os.getpid()}.tmp"  # one per process: ranks of one run never share a temp file
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, folder / MARKER)
