"""Every count a command takes has a documented upper bound: the memory, processes or time it allocates stay sane.

`BOUNDS` names each integer flag's bound and why; `apply_bounds` gives every integer flag of the parser (its type
`positive_int` or `nonneg_int`) its bound, refused with the flag's name before any work, and shows it in --help.
`tests/test_command_rules.py` walks every subcommand: an integer flag without a bound breaks the suite."""
from __future__ import annotations

import argparse
import os


def max_workers() -> int:
    """Processes or threads a command may start: 4 x this machine's cores, at least 8."""
    return max(8, 4 * (os.cpu_count() or 1))


_EPOCHS = (100_000, "epochs")
_STEPS = (100_000_000, "steps")
_BATCH = (65_536, "examples in one step or call")
_ITEMS = (1_000_000_000, "items")

# flag -> (largest value, what it counts). A callable bound is computed on this machine.
BOUNDS: dict[str, tuple] = {
    "--batch-size": _BATCH, "--max-batch": _BATCH, "--max-negatives": _BATCH, "--negative-groups": _BATCH,
    "--workers": (max_workers, "processes (4 x the cores, at least 8)"),
    "--threads": (max_workers, "threads (4 x the cores, at least 8)"),
    "--epochs": _EPOCHS, "--stage1-epochs": _EPOCHS, "--stage2-epochs": _EPOCHS, "--stage3-epochs": _EPOCHS,
    "--identity-epochs": _EPOCHS, "--joint-epochs": _EPOCHS,
    "--max-steps": _STEPS, "--sync-every": _STEPS, "--oti-steps": _STEPS, "--warmup-steps": _STEPS,
    "--images": (_ITEMS[0], "images"), "--top-k": (1_000_000, "concepts"),
    "--shard-size": (65_536, "rows or samples in one shard (a shard is held in memory while written)"),
    "--queries": (100_000, "queries per split (query ids have five digits)"),
    "--min-pairs": (64, "(local, context) pairs per caption"), "--max-pairs": (64, "(local, context) pairs per caption"),
    "--per-caption": (64, "edits per caption"),
    "--limit": _ITEMS, "--max-triplets": _ITEMS, "--pairs": _ITEMS, "--train-size": (100_000_000, "vectors"),
    "--k": (10_000, "results"), "--max-k": (10_000, "results"), "--max-knn": (10_000, "results"),
    "--chord-shortlist": (100_000, "candidates"), "--refine": (1_000, "times k candidates re-ranked"),
    "--vit-width": (8_192, "channels"), "--vit-layers": (128, "layers"), "--vit-heads": (128, "heads"),
    "--patch-size": (1_024, "pixels"), "--layers": (48, "CAAM layers"), "--probes": (1_024, "CAAM probe tokens"),
    "--lora-rank": (4_096, "LoRA rank"),
    "--retries": (100, "retries"), "--concurrency": (1_024, "requests in flight"),
    "--commit-every": (1_000_000, "results per transaction"), "--max-tokens": (131_072, "tokens"),
    "--min-shared-heads": (64, "words"), "--max-upload-mb": (4_096, "MB"), "--max-text": (100_000, "characters"),
    "--dist-timeout": (86_400, "seconds"),
}


def bound_of(action: argparse.Action) -> tuple[int, str] | None:
    flag = next((s for s in action.option_strings if s.startswith("--")), None)
    entry = BOUNDS.get(flag) if flag else None
    if entry is None:
        return None
    hi, what = entry
    return (hi() if callable(hi) else hi), what


def is_count(action: argparse.Action) -> bool:
    """An integer flag: its type is `common.positive_int` or `nonneg_int` (marked `count`), or already bounded."""
    return getattr(action.type, "count", False) or getattr(action.type, "bounded", None) is not None


def apply_bounds(p: argparse.ArgumentParser) -> None:
    """Gives every integer flag of every command of `p` its bound (`BOUNDS`)."""
    for cmd in _parsers(p):
        for action in cmd._actions:
            if is_count(action) and getattr(action.type, "bounded", None) is None:
                bound = bound_of(action)
                if bound is not None:
                    action.type = _bounded(action.type, *bound)
                    if action.help != argparse.SUPPRESS:
                        action.help = f"{action.help or ''} (at most {bound[0]:,})".strip()


def _parsers(p: argparse.ArgumentParser):
    yield p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def _bounded(parse, hi: int, what: str):
    def bounded(v: str) -> int:
        n = parse(v)
        if n > hi:
            raise argparse.ArgumentTypeError(f"{n} is above the bound of {hi:,} {what}")
        return n
    bounded.bounded = hi
    return bounded
