"""Every command's rules: what it reads and writes, declared beside its flags (`declare`, `add_owned_output`), and
the one runner that applies them before the command writes anything (`enforce`, called by `foco.cli.main`).

From the declaration alone the runner:
- refuses an output folder of another kind of artifact, or a user's folder without --force (`foco.utils.ownership`);
- writes the owner file before the command's first file, so that a killed run is resumed, not refused as foreign,
  and records there what the output was made from; a folder entered with --force records the user's files, which a
  restart never removes (`ownership.removable`);
- refuses inputs of different worlds (a world, feature caches, an edit store: `provenance.py`), and a rerun into an
  output made from another world (a resumed trainer, a protocol written into another world's folder) unless the run
  restarts;
- refuses weights evaluated on the split of the world they were trained on.
A command whose parser declares nothing cannot run (`enforce` raises), and `tests/test_command_rules.py` walks every
subcommand of the parser: each string flag is declared as read, written or a plain value."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path

# What an input flag may name. The kinds with a provenance reader (`provenance.READERS`) are compared by the runner.
READ_KINDS = ("world", "benchmark root", "feature cache", "feature caches", "weights", "edit store",
              "decomposition store", "search index", "backbone", "images", "image", "shards or captions", "stores",
              "world backbone")

# The weights flags of the served methods (`foco search`, `foco serve`).
SERVED_WEIGHTS = {w: "weights" for w in ("checkpoint", "foco_edits", "pic2word", "lincir", "searle", "context_i2w", "tat", "adafocal")}


@dataclass(frozen=True)
class Output:
    """A folder the command writes (`kind`: `ownership.KINDS`, None for a kind-less folder)."""
    dest: str
    kind: str | None
    signature: tuple[str, ...]
    flag: str


@dataclass(frozen=True)
class Rules:
    reads: tuple[tuple[str, str, str], ...] = ()  # (dest, READ_KINDS, its flag)
    writes: tuple[Output, ...] = ()             # output folders
    files: tuple[str, ...] = ()                 # output files (a results JSON, a SQLite store)
    folders: tuple[str, ...] = ()               # folders it writes into file by file, each file checked where
                                                # it is written (a cache's manifest, a submission's owner file)
    into: tuple[str, ...] = ()                  # read dests the command writes inside (a world's protocols)
    values: tuple[str, ...] = ()                # string flags that name no file (methods, URLs, a text)
    evaluates: tuple[str, str] | None = None    # (dest of the world read, dest of the split) it scores on
    declared: bool = False                      # `declare` was called: the reads are complete

    def dests(self) -> set[str]:
        return ({d for d, _, _ in self.reads} | {o.dest for o in self.writes} | set(self.files) | set(self.folders)
                | set(self.values))


def rules_of(p: argparse.ArgumentParser) -> Rules:
    return p.get_default("_rules") or Rules()


def declare(p: argparse.ArgumentParser, reads: dict[str, str] | None = None, files: tuple[str, ...] = (),
            folders: tuple[str, ...] = (), into: tuple[str, ...] = (), values: tuple[str, ...] = (),
            evaluates: tuple[str, str] | None = None) -> None:
    """Declares what the command of parser `p` reads ({dest: kind}), the files it writes, the inputs it writes
    inside, its string flags that name no file, and the split it evaluates on. Output folders are declared by
    `add_owned_output`."""
    unknown = sorted({k for k in (reads or {}).values()} - set(READ_KINDS))
    if unknown:
        raise ValueError(f"unknown read kinds {unknown}; known: {', '.join(READ_KINDS)}")
    r = rules_of(p)
    read = tuple((dest, kind, _flag(p, dest)) for dest, kind in (reads or {}).items())
    p.set_defaults(_rules=replace(r, reads=(*r.reads, *read), files=(*r.files, *files), folders=(*r.folders, *folders),
                                  into=(*r.into, *into), values=(*r.values, *values),
                                  evaluates=evaluates or r.evaluates, declared=True))


def plain(p: argparse.ArgumentParser, *dests: str) -> None:
    """Declares string flags that name no file (`--device`), from an argument group shared by many commands (it
    does not make a command declared)."""
    r = rules_of(p)
    p.set_defaults(_rules=replace(r, values=(*r.values, *dests)))


def _flag(p: argparse.ArgumentParser, dest: str) -> str:
    return next((a.option_strings[0] if a.option_strings else a.dest for a in p._actions if a.dest == dest), dest)


def add_output(p: argparse.ArgumentParser, out: Output) -> None:
    r = rules_of(p)
    p.set_defaults(_rules=replace(r, writes=(*r.writes, out)))


@dataclass
class Claimed:
    """What `enforce` did: the folders it created (removed again when the command fails before writing in them)."""
    created: list[Path] = field(default_factory=list)

    def undo_empty(self) -> None:
        from ..utils.ownership import MARKER
        for folder in self.created:
            try:
                if folder.is_dir() and [p.name for p in folder.iterdir()] == [MARKER]:
                    (folder / MARKER).unlink()
                    folder.rmdir()
            except OSError:
                pass


def enforce(a: argparse.Namespace) -> Claimed:
    """Applies the command's declared rules (module docstring) before it runs; returns what it created."""
    from .provenance import check_same_world, check_split_apart, inputs_of
    rules = getattr(a, "_rules", None)
    if rules is None or not rules.declared:
        raise RuntimeError(f"`foco {command_name(a)}` declares no rules (foco.cli.rules.declare): it may not run")
    inputs = inputs_of(a, rules)
    for dest in rules.files:
        check_writable(getattr(a, dest, None), _flag_in(a, dest))
    check_same_world(inputs)
    check_split_apart(a, rules, inputs)
    claimed = Claimed()
    try:
        _claim_outputs(a, rules, inputs, claimed)
    except BaseException:
        claimed.undo_empty()  # a refusal leaves no folder of its own behind
        raise
    return claimed


def main_rank() -> bool:
    """Whether this process writes a run's owner files: one process alone, or rank 0 under torchrun (the other
    ranks check the same rules and write nothing there)."""
    import os
    return os.environ.get("RANK", "0") == "0"


def _claim_outputs(a: argparse.Namespace, rules: Rules, inputs: dict, claimed: Claimed) -> None:
    from ..utils.io import WriteError, unwritable_reason
    from ..utils.ownership import (check_folder, check_kind, enter_foreign, is_empty_or_owned, mark_folder,
                                   record_inputs)
    from .provenance import check_rerun
    force = getattr(a, "force", False)
    mine: list[Path] = []  # the folders this command claimed: another of its outputs may lie inside one
    for out in rules.writes:
        value = getattr(a, out.dest, None)
        if not value:
            continue
        folder = Path(value)
        why = unwritable_reason(folder)
        if why:
            raise WriteError(f"{out.flag} {folder}: cannot write there ({why}); choose a writable {out.flag}")
        if out.kind:
            check_kind(folder, out.kind, command_name(a), out.flag, inside=tuple(mine))
        foreign = not is_empty_or_owned(folder, out.signature)
        check_folder(folder, out.signature, force, out.flag)
        check_rerun(a, out, inputs)
        existed = folder.exists()
        mine.append(folder.resolve())
        if not main_rank():
            continue
        try:
            if foreign:
                enter_foreign(folder)  # stays the user's: the next command needs --force again
            else:
                mark_folder(folder, command_name(a), out.kind)  # before the first file: a killed run resumes
                if inputs:
                    record_inputs(folder, {flag: p for flag, p in inputs.items() if p.get("worlds")})
        except OSError as exc:
            raise WriteError(f"{out.flag} {folder}: cannot write there ({exc.strerror}); choose a writable "
                             f"{out.flag}") from None
        if not existed:
            claimed.created.append(folder)


def check_writable(path: str | Path | None, flag: str) -> None:
    """Fails now, not after hours of work, when the output file `path` of `flag` cannot be written."""
    import os
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p} is a folder; give a file name, e.g. {p / 'results.json'}")
    parent = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{flag} {p}: cannot create its folder ({exc})") from None
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{flag} {p} is not writable; choose a writable {flag}")


def _flag_in(a: argparse.Namespace, dest: str) -> str:
    return "--" + ("out" if dest == "merge_out" else dest.replace("_", "-"))


def command_name(a: argparse.Namespace) -> str:
    return " ".join(str(getattr(a, k)) for k in ("command", "action") if getattr(a, k, None))


def commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every command of the parser `p` as (its words, its parser): each leaf, and a group that runs on its own."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs or not subs[0].required:
        if path:
            yield path, p
    for s in subs:
        for name, child in s.choices.items():
            yield from commands(child, (*path, name))


def _names_a_value(action: argparse.Action) -> bool:
    """A flag whose value is free text: a path, a list, a URL (not a number, a choice or a switch)."""
    if isinstance(action, (argparse._HelpAction, argparse._StoreConstAction, argparse._CountAction,
                           argparse._SubParsersAction, argparse._VersionAction)) or action.nargs == 0:
        return False
    return action.choices is None and action.type in (None, str)


def problems(p: argparse.ArgumentParser) -> list[str]:
    """What keeps the commands of `p` from their rules: a command that declares nothing, a free-text flag declared
    neither as read, written nor a plain value, a declaration naming a flag the command lacks."""
    from .bounds import is_count
    found = []
    for path, cmd in commands(p):
        name = " ".join(path)
        rules = rules_of(cmd)
        if not rules.declared:
            found.append(f"`foco {name}` declares no rules (foco.cli.rules.declare)")
            continue
        dests = {a.dest for a in cmd._actions}
        for dest in sorted(rules.dests() - dests):
            found.append(f"`foco {name}` declares {dest!r}, which it has no flag for")
        for action in cmd._actions:
            if is_count(action) and getattr(action.type, "bounded", None) is None:
                found.append(f"`foco {name}` has no upper bound for {action.option_strings[0]} (foco.cli.bounds)")
            if _names_a_value(action) and action.dest not in rules.dests():
                flag = action.option_strings[0] if action.option_strings else action.dest
                found.append(f"`foco {name}` does not declare {flag}: read (and of what kind), written, or a value")
    return found
