"""Test-server submission files for CIRR and CIRCO, validated before they are written (atomically).

* CIRR: two files, {"version": "rc2", "metric": "recall", "<pairid>": [top-50 names]} and
  {"version": "rc2", "metric": "recall_subset", "<pairid>": [top-3 names]}.
* CIRCO: {"<query id>": [top-50 image ids]} (ids written as integers when they are).

Validation: every query id exactly once, every prediction a known gallery id, no repeats within a query, the
expected length (50, or what a smaller gallery allows), CIRR rankings without the reference and subset
predictions inside the subset, and at most 5 MB per file. Anything else raises SubmissionError.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..utils.io import atomic_write_text
from ..benchmarks.base import CIRBenchmark
from .rank import SUBMISSION_DEPTH, Rankings

MAX_BYTES = 5 * 1024 * 1024  # both servers refuse larger files
CIRR_SUBSET_DEPTH = 3


class SubmissionError(ValueError):
    """A submission file would be refused by the server (or score wrongly); nothing was written."""


Predictions = Sequence[tuple[str, list[str]]]  # (query id, ranked gallery ids), one per query


def validate(preds: Predictions, bench: CIRBenchmark, depth: int, subset: bool = False) -> None:
    """Checks `preds` against the benchmark; raises SubmissionError listing every kind of problem found."""
    problems = []
    ids = [q for q, _ in preds]
    counts: dict[str, int] = {}
    for q in ids:
        counts[q] = counts.get(q, 0) + 1
    dup = [q for q, n in counts.items() if n > 1]
    expected = {q.id for q in bench.queries}
    missing = [q for q in expected if q not in counts]
    extra = [q for q in counts if q not in expected]
    for what, bad in (("query ids given more than once", dup), ("queries without predictions", missing),
                      ("unknown query ids", extra)):
        if bad:
            problems.append(f"{len(bad)} {what}, e.g. {sorted(bad)[:3]}")
    known = set(bench.gallery)
    by_id = {q.id: q for q in bench.queries}
    checks = {"with a wrong number of predictions": [], "with repeated predictions": [],
              "with ids not in the gallery": [], "ranking the reference (CIRR removes it)": [],
              "with predictions outside the query's subset": []}
    for qid, ranked in preds:
        query = by_id.get(qid)
        pool = known if not subset or query is None else set(query.subset) - {query.reference}
        want = min(depth, len(pool) - (bench.protocol.remove_reference and not subset))
        if len(ranked) != want:
            checks["with a wrong number of predictions"].append(f"{qid} ({len(ranked)}, not {want})")
        if len(set(ranked)) != len(ranked):
            checks["with repeated predictions"].append(qid)
        if any(r not in known for r in ranked):
            checks["with ids not in the gallery"].append(qid)
        if query is not None and bench.protocol.remove_reference and query.reference in ranked:
            checks["ranking the reference (CIRR removes it)"].append(qid)
        if subset and query is not None and any(r not in pool for r in ranked):
            checks["with predictions outside the query's subset"].append(qid)
    problems += [f"{len(bad)} queries {what}, e.g. {bad[:3]}" for what, bad in checks.items() if bad]
    if problems:
        raise SubmissionError(f"{bench.name} {bench.split} submission refused: " + "; ".join(problems))


def _dump(path: Path, data: dict, max_bytes: int) -> Path:
    """Writes one submission file; one of that name which foco did not write is never replaced (the folder is
    shared with other files: `foco.utils.ownership`)."""
    from ..utils.ownership import check_outputs, record_outputs
    text = json.dumps(data)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise SubmissionError(f"{path.name} would be {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB limit")
    path.parent.mkdir(parents=True, exist_ok=True)
    check_outputs(path.parent, [path], flag="--submission-dir")
    atomic_write_text(path, text)
    record_outputs(path.parent, [path])
    return path


def write_cirr(out_dir: str | Path, bench: CIRBenchmark, recall: Predictions, recall_subset: Predictions,
               prefix: str = "cirr", max_bytes: int = MAX_BYTES) -> list[Path]:
    """Validates both prediction sets, then writes `<prefix>_recall.json` and `<prefix>_recall_subset.json`."""
    validate(recall, bench, SUBMISSION_DEPTH)
    validate(recall_subset, bench, CIRR_SUBSET_DEPTH, subset=True)
    out_dir = Path(out_dir)
    files = []
    for metric, preds in (("recall", recall), ("recall_subset", recall_subset)):
        data = {"version": "rc2", "metric": metric, **{q: list(r) for q, r in preds}}
        files.append(_dump(out_dir / f"{prefix}_{metric}.json", data, max_bytes))
    return files


def write_circo(out_dir: str | Path, bench: CIRBenchmark, preds: Predictions, prefix: str = "circo",
                max_bytes: int = MAX_BYTES) -> list[Path]:
    """Validates, then writes `<prefix>.json` = {query id: [top-50 image ids]}."""
    validate(preds, bench, SUBMISSION_DEPTH)
    data = {q: [int(r) if r.isdigit() else r for r in ranked] for q, ranked in preds}
    return [_dump(Path(out_dir) / f"{prefix}.json", data, max_bytes)]


def predictions(bench: CIRBenchmark, r: Rankings) -> tuple[Predictions, Predictions]:
    """(top-50 over the gallery, top-3 over the subset) as gallery ids, per query."""
    full = [(q.id, [r.gallery_ids[i] for i in row[:SUBMISSION_DEPTH]])
            for q, row in zip(bench.queries, r.full.tolist())] if r.full is not None else []
    sub = [(q.id, [r.gallery_ids[i] for i in row[:CIRR_SUBSET_DEPTH]])
           for q, row in zip(bench.queries, r.subset)] if r.subset is not None else []
    return full, sub


def write_submission(out_dir: str | Path, bench: CIRBenchmark, r: Rankings, method: str) -> list[Path]:
    """The test-server files of the benchmark's format for one method's rankings."""
    full, sub = predictions(bench, r)
    if bench.protocol.submission == "cirr":
        return write_cirr(out_dir, bench, full, sub, prefix=f"cirr_{bench.split}_{method}")
    if bench.protocol.submission == "circo":
        return write_circo(out_dir, bench, full, prefix=f"circo_{bench.split}_{method}")
    raise ValueError(f"{bench.name} has no submission format")
