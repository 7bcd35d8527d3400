"""Where a trained method's weights came from: the backbone each weights folder records (`MethodOption.record`),
read before a method is built, so that evaluation, search and serving refuse weights trained on another backbone's
features. Reads the registry's declared options (`foco.methods.declared_options`)."""
from __future__ import annotations

from pathlib import Path

from . import declared_options
from .base import MethodOption, MethodOptions


PROVENANCE_RECORDED = ("foco.json", "pic2word.json")  # records whose trainers always write "provenance"


def weights_options() -> dict[str, MethodOption]:
    """Every registered method's weights-folder options (those with a `record`), by name."""
    return {name: opt for name, (opt, _) in declared_options().items() if opt.record}


def recorded_backbones(opts: MethodOptions) -> list[tuple[str, Path, object]]:
    """(flag, folder, recorded backbone) of every trained method's folder in `opts`: each was trained on features
    of that backbone, and must be used on features of the same. The recorded backbone is None where the record
    lost it (or an older foco wrote none): `check_trained_on` refuses such a folder unless `opts.unverified`."""
    out = []
    for name, opt in weights_options().items():
        folder = opts.get(name)
        if folder is None:
            continue
        if not (Path(folder) / opt.record).is_file():
            raise FileNotFoundError(f"{opt.flag} {folder}: no {opt.record} there ({opt.help} holds one); check "
                                    f"the path given to {opt.flag}")
        meta = _read_record(Path(folder) / opt.record)
        recorded = (meta.get("provenance") or {}).get("backbone") or meta.get("backbone")
        if opt.own_backbone and isinstance(recorded, dict):  # copied or moved: the backbone is where it lies now
            recorded = {**recorded, "spec": f"{opt.own_backbone}:{Path(folder).resolve()}"}
        if isinstance(recorded, dict) and not recorded.get("spec"):
            recorded = None
        if opt.record in PROVENANCE_RECORDED and "train" in meta and "provenance" not in meta:
            recorded = None  # its trainer records the backbone's weights there: the record lost them
        out.append((opt.flag, Path(folder), recorded))
    return out


def unverified(opts: MethodOptions) -> list[str]:
    """The weights folders in `opts` that record no backbone ("--checkpoint runs/x"): what a result computed with
    them under --unverified must name as unchecked."""
    return [f"{flag} {folder}" for flag, folder, recorded in recorded_backbones(opts) if recorded is None]


def recorded_spec(opts: MethodOptions) -> str | None:
    """The backbone spec the first given weights folder records (in the methods' registry order), or None: the
    default backbone when none is named."""
    for _, _, recorded in recorded_backbones(opts):
        if recorded is None:
            continue
        spec = recorded.get("spec") if isinstance(recorded, dict) else recorded
        if isinstance(spec, str):
            return spec
    return None


def check_trained_on(opts: MethodOptions, backbone, what: str, fix: str) -> None:
    """Refuses a trained method's folder made on another backbone's features than `backbone` (a record or a
    spec) of `what`, naming both, the flag and `fix`."""
    from ..backbones import check_same_backbone
    for flag, folder, recorded in recorded_backbones(opts):
        if recorded is None:
            if opts.unverified:
                continue
            record = next(o.record for o in weights_options().values() if o.flag == flag)
            raise ValueError(f"{flag} {folder}: its {record} records no backbone (the record was edited, or an "
                             f"older foco wrote it), so it cannot be checked against {what}; retrain it, or pass "
                             "--unverified to use it unchecked (the results then say they are unverified)")
        check_same_backbone(recorded, f"{flag} {folder}", backbone, what,
                            f"{fix}, or pass a {flag} trained on that backbone's features")


def _read_record(path: Path) -> dict:
    """A weights folder's record, checked against its schema (`foco.records`) where it has one."""
    from ..records import SCHEMAS, read
    from ..utils.io import read_json
    return read(path.name, path) if path.name in SCHEMAS else read_json(path)
