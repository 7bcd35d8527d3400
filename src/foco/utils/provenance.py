"""What made a file: the command, the machine, the library versions and the code revision, recorded next to
weights that others will load (the shipped world backbone, for one)."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict:
    """{"command", "machine", "python", "torch", "foco_commit", "date"} of the running process."""
    import torch
    return {"command": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name, *sys.argv[1:]]),
            "machine": f"{os.cpu_count()} x {_cpu_model()}, {platform.system()} {platform.machine()}",
            "python": platform.python_version(), "torch": torch.__version__, "foco_commit": _git_commit(),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}
