"""What several command groups share: argument groups, value parsing, printing."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from .rules import check_writable  # noqa: F401  (evaluate's --out)
from .numbers import (finite_float, float_in, learning_rate, lora_alpha, loss_weight, seconds,  # noqa: F401
                      unit_float, wait_seconds)


def _int_at_least(v: str, least: int, refusal: str) -> int:
    """An integer in ASCII digits, at least `least` and within int64 (`foco.utils.parse`, the server's rule too)."""
    from ..utils.parse import INT64, ascii_integer
    try:
        n = ascii_integer(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not an integer within [{INT64[0]}, {INT64[1]}] in ASCII "
                                         "digits") from None
    if n < least:
        raise argparse.ArgumentTypeError(f"{n} {refusal}")
    return n


def seed_int(v: str) -> int:
    """argparse type: a seed, an integer in [0, 2**32 - 1] (`foco.utils.parse.MAX_SEED`)."""
    from ..utils.parse import MAX_SEED, ascii_integer
    try:
        return ascii_integer(v, 0, MAX_SEED)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a seed (an integer from 0 to {MAX_SEED})") from None


def positive_int(v: str) -> int:
    """argparse type: an integer >= 1 (0 or a negative count is refused, never read as "no limit")."""
    return _int_at_least(v, 1, "is not a positive count (leave the flag out for its default)")


def nonneg_int(v: str) -> int:
    """argparse type: an integer >= 0 (epochs: 0 skips a stage)."""
    return _int_at_least(v, 0, "is negative")


positive_int.count = nonneg_int.count = True  # each flag of theirs gets its upper bound (`foco.cli.bounds`)


def add_owned_output(p: argparse.ArgumentParser, dest: str = "out", signature: tuple[str, ...] = (),
                     flag: str | None = None, kind: str | None = None) -> None:
    """Declares that the folder of `dest` is written by this command (`foco.cli.rules`): the runner claims it before
    the command runs, refusing a non-empty folder foco did not write (`foco.utils.ownership`) unless --force, and a
    folder of another `kind` of artifact (`ownership.KINDS`) always. A folder an earlier foco wrote is recognised by
    its kind's files (`KINDS[kind]`) and by `signature`, files several kinds share (a training state, its log)."""
    from ..utils.ownership import KINDS
    from .rules import Output, add_output
    if not any("--force" in a.option_strings for a in p._actions):
        p.add_argument("--force", action="store_true",
                       help="write into an output folder that holds files foco did not write (they are left as they "
                            "are; an output of the same name is replaced)")
    signature = (*signature, *(KINDS[kind] if kind else ()))
    add_output(p, Output(dest, kind, tuple(signature), flag or f"--{dest.replace('_', '-')}"))


def input_record(path: str | Path | None, **extra) -> dict:
    """What a store records of an input it was made from: the path (resolved), the sha256 of a file, and a world
    folder's fingerprint (`world_fingerprint`: what training checks an edit store against)."""
    if path is None:
        return dict(extra)
    from ..utils.io import sha256_file
    from ..world.generate import world_fingerprint
    p = Path(path)
    world = world_fingerprint(p) if p.is_dir() else None
    return {"input": str(p.resolve()) if p.exists() else str(path),
            "sha256": sha256_file(p) if p.is_file() else None, **({"world": world} if world else {}), **extra}


def setting_list(v: str) -> list[str]:
    """argparse type: comma-separated setting names, as flags ("lr-stage1") or fields ("lr_stage1")."""
    names = [n.strip().lstrip("-").replace("-", "_") for n in v.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one setting, e.g. --allow-changed lr-stage1")
    return names


def float_or_val(v: str | None, flag: str, lo: float = -math.inf, hi: float = math.inf) -> float | str | None:
    """A finite number in [lo, hi], or "val" (choose it on the val split), or None."""
    from ..utils.parse import number_or_word
    return None if v is None else number_or_word(v, "val", flag, lo, hi)


def flag_dest(flag: str) -> str:
    """argparse's attribute name of `flag` ("--foco-edits" -> "foco_edits")."""
    return flag.lstrip("-").replace("-", "_")


def add_decomposition_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decompositions", default=None,
                   help="SQLite store written by `foco decompose` (default: the world's oracle decompositions)")
    p.add_argument("--decomposer", default="oracle",
                   help="which decomposer's results to read from the store: a name or a settings id")
    p.add_argument("--max-fallback", type=unit_float, default=0.01,
                   help="largest share of captions a fallback may have decomposed (flagged rows; default 0.01)")


def print_table(title: str, metrics: dict) -> None:
    print(f"\n| {title} | value |\n|---|---|")
    for k, v in metrics.items():
        print(f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |")


def add_llm_args(p: argparse.ArgumentParser) -> None:
    """The options of an OpenAI-compatible chat-completions server, shared by every LLM job."""
    llm = p.add_argument_group("llm (an OpenAI-compatible chat-completions server)")
    llm.add_argument("--llm-url", default=None,
                     help="base URL, e.g. http://127.0.0.1:8000/v1 (env FOCO_LLM_URL); several, comma-separated, "
                          "are used round-robin and a failing one rests")
    llm.add_argument("--llm-model", default=None, help="model name (env FOCO_LLM_MODEL)")
    llm.add_argument("--llm-key", default=None, help="API key (env FOCO_LLM_API_KEY or OPENAI_API_KEY)")
    llm.add_argument("--timeout", type=seconds, default=60.0, help="seconds per request")
    llm.add_argument("--retries", type=nonneg_int, default=3, help="retries per item before the rule fallback")
    llm.add_argument("--backoff", type=wait_seconds, default=1.0, help="first retry wait in seconds (doubles)")
    llm.add_argument("--concurrency", type=positive_int, default=4,
                     help="requests in flight, across store transactions (about the servers' batch size in all)")
    llm.add_argument("--max-tokens", type=positive_int, default=400, help="most tokens an LLM answer may use")
    llm.add_argument("--json-mode", action="store_true", help="request response_format json_object")


def add_commit_args(p: argparse.ArgumentParser, unit: str) -> None:
    """When a streaming LLM job stores what has completed: every N results or S seconds, one transaction each."""
    p.add_argument("--commit-every", type=positive_int, default=256,
                   help=f"llm: {unit} per store transaction (results are stored as they complete)")
    p.add_argument("--commit-seconds", type=seconds, default=5.0,
                   help="llm: store what has completed at least this often (seconds)")


def chat_config(a: argparse.Namespace):
    from ..decompose.client import ChatConfig
    return ChatConfig(url=a.llm_url or "", model=a.llm_model or "", api_key=a.llm_key or "", timeout_s=a.timeout,
                      max_tokens=a.max_tokens, json_mode=a.json_mode)


def add_precision_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                   help="fp32 (default), bf16 autocast, or auto (bf16 where the CPU or GPU computes it natively)")


def add_device_arg(p: argparse.ArgumentParser) -> None:
    """--device on every command that runs a model; resolved once by `foco.utils.device.resolve_device`."""
    from ..utils.device import DEVICE_HELP
    from .rules import plain
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    plain(p, "device")


UNVERIFIED_HELP = ("use a trained method's folder whose record no longer says which backbone it was trained on "
                   "(refused otherwise); the results then name it as unverified")


def add_unverified_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unverified", action="store_true", help=UNVERIFIED_HELP)


def add_distributed_args(p: argparse.ArgumentParser, sync: bool = True) -> None:
    """The options of a data-parallel trainer under torchrun: its timeouts, the forced path of one process, and
    how often its losses are read (`sync`)."""
    from ..train.distributed import DEFAULT_TIMEOUT_S, SETUP_TIMEOUT_S
    p.add_argument("--dist-timeout", type=seconds, default=DEFAULT_TIMEOUT_S,
                   help="under torchrun: seconds a rank waits for the others during training before the job stops "
                        "(on nccl, set TORCH_NCCL_BLOCKING_WAIT=1 for a Python error that says how to resume, at "
                        "the price of a host wait per collective)")
    p.add_argument("--setup-timeout", type=seconds, default=SETUP_TIMEOUT_S,
                   help="under torchrun: seconds a rank waits for the others before the first step, while one of "
                        "them may work alone (encoding edit texts, hashing shards, compiling)")
    p.add_argument("--force-distributed", action="store_true",
                   help="the data-parallel path (a process group, DDP, the gathers) even in one process: one GPU "
                        "runs what 8 run (nccl on a GPU, gloo on the CPU)")
    if sync:
        p.add_argument("--sync-every", type=positive_int, default=None,
                       help="read the logged losses and the finite check every N steps (default: 1 on the CPU, 50 "
                            "on a GPU, where each read makes the CPU wait for the GPU)")


def run_context(a: argparse.Namespace):
    """The run's context (`foco.train.distributed.RunContext`) from a trainer's options, made once: this rank's
    device and ranks, the process group joined (under torchrun or --force-distributed), seed and --out."""
    import sys
    from ..train.distributed import group_line, start_run
    env = start_run(launch(a), a.seed, a.out)
    line = group_line(env)
    if line:
        print(line, file=sys.stderr, flush=True)
    return env


def launch(a: argparse.Namespace):
    """A trainer's --device, --force-distributed, --dist-timeout and --setup-timeout as a typed `Launch`."""
    from ..train.distributed import Launch
    return Launch(a.device, bool(a.force_distributed), a.dist_timeout, a.setup_timeout)
