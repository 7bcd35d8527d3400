"""Issue 55's probe as a table: runs tests/reliability/test_probe_rules.py (one pytest process, no xdist, no cache)
with a junit-xml report, and prints per class of the issue the number of cases, how many passed, and the failures
split by the class of failure each one showed (data loss, unhandled, silently wrong), with the totals and the
percentages.

Each case records its class (`probe_class`) and the failure it would show (`probe_label`) as junit properties; a
failing case records the one it showed (`probe_observed`). A case that failed without recording one (an error in a
fixture, say) is counted under its label and listed below the table.

    python experiments/probe_rules_table.py [--repo PATH] [--keep-xml FILE]

--repo is the checkout whose src/ and tests/ are run (default: this one). The run's own exit status is not this
script's: it prints the table and exits 0 when the table was made, 2 when pytest produced no report.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

TEST = "tests/reliability/test_probe_rules.py"
CLASSES = {"A": "ownership and data loss", "B": "resume", "C": "provenance", "D": "integrity", "E": "bounds",
           "F": "text parsed by hand", "G": "serving"}
LABELS = ("data loss", "unhandled", "silently wrong")


def run(repo: Path, xml: Path) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo / "src"),
                                                                      os.environ.get("PYTHONPATH", "")])),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-o", "junit_family=xunit1",
           f"--junitxml={xml}", TEST]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    return done.returncode, time.monotonic() - t0, done.stdout[-3000:] + done.stderr[-3000:]


def read(xml: Path) -> list[dict]:
    cases = []
    for tc in ET.parse(xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        failed = tc.find("failure") is not None or tc.find("error") is not None
        skipped = tc.find("skipped") is not None
        cases.append({"id": f"{tc.get('classname')}::{tc.get('name')}", "cls": props.get("probe_class", "?"),
                      "label": props.get("probe_label", "unhandled"), "observed": props.get("probe_observed"),
                      "failed": failed, "skipped": skipped, "seconds": float(tc.get("time") or 0)})
    return cases


def pct(n: int, d: int) -> str:
    return f"{100 * n / d:.0f} %" if d else "-"


def table(cases: list[dict]) -> str:
    rows = ["| class | cases | passed | failed | data loss | unhandled | silently wrong |",
            "|---|---|---|---|---|---|---|"]
    total = {"cases": 0, "passed": 0, "failed": 0, **{l: 0 for l in LABELS}}
    for key in [*CLASSES, "?"]:
        mine = [c for c in cases if c["cls"] == key]
        if not mine:
            continue
        failed = [c for c in mine if c["failed"] or c["skipped"]]
        split = {l: sum(1 for c in failed if (c["observed"] or c["label"]) == l) for l in LABELS}
        passed = len(mine) - len(failed)
        name = f"{key}. {CLASSES[key]}" if key in CLASSES else "unlabelled"
        rows.append(f"| {name} | {len(mine)} | {passed} ({pct(passed, len(mine))}) | {len(failed)} "
                    f"({pct(len(failed), len(mine))}) | " + " | ".join(str(split[l]) for l in LABELS) + " |")
        total["cases"] += len(mine)
        total["passed"] += passed
        total["failed"] += len(failed)
        for l in LABELS:
            total[l] += split[l]
    n = total["cases"]
    rows.append(f"| **total** | **{n}** | **{total['passed']} ({pct(total['passed'], n)})** | **{total['failed']} "
                f"({pct(total['failed'], n)})** | " + " | ".join(f"**{total[l]} ({pct(total[l], n)})**"
                                                                 for l in LABELS) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]),
                   help="the checkout to run the probe in (default: this one)")
    p.add_argument("--keep-xml", default=None, help="also keep the junit-xml report here")
    a = p.parse_args(argv)
    repo = Path(a.repo).resolve()
    if not (repo / TEST).is_file():
        print(f"probe_rules_table: {repo / TEST} does not exist", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="probe-rules-") as tmp:
        xml = Path(a.keep_xml) if a.keep_xml else Path(tmp) / "report.xml"
        code, seconds, tail = run(repo, xml)
        if not xml.is_file():
            print(f"probe_rules_table: pytest wrote no report (exit {code}):\n{tail}", file=sys.stderr)
            return 2
        cases = read(xml)
    print(f"Issue 55 probe, `{TEST}` in {repo}: {len(cases)} cases in {seconds:.0f} s (pytest exit {code}).\n")
    print(table(cases))
    unrecorded = [c["id"] for c in cases if (c["failed"] or c["skipped"]) and not c["observed"]]
    if unrecorded:
        print("\nFailed without recording what they showed (counted under their own label): "
              + ", ".join(unrecorded))
    print("\nEach failure is counted under the class of failure it showed: a user's file or foco's output removed or "
          "changed (data loss); a traceback, another exit code than 0 or 2, a hang or a memory limit (unhandled); "
          "exit 0 where a refusal was due, or a wrong result (silently wrong). A refusal where the command should "
          "have run, or one that names nothing the user can act on, counts under the case's own label.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
