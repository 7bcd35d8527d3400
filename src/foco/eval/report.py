"""Results of `foco.eval.evaluate.evaluate` as Markdown tables, for the terminal and the docs."""
from __future__ import annotations


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(r) + " |" for r in rows)])


def metrics_table(rows: dict[str, dict[str, float]], digits: int = 2, key: str = "method") -> str:
    """One row per key ({method: {metric: value}}), one column per metric in first-seen order; "-" where missing."""
    cols = list(dict.fromkeys(k for m in rows.values() for k in m))
    return markdown_table([key, *cols], [[name, *(f"{m[c]:.{digits}f}" if c in m else "-" for c in cols)]
                                         for name, m in rows.items()])


CHOSEN_ON_SCORED_SPLIT = ("these parameters were chosen on the same val split the table scores, so the rows of "
                          "the methods they tune are optimistic; report the test split (--split test), or fix them "
                          "(e.g. --slerp-alpha 0.8) for a fair val comparison")


def results_table(results: dict) -> str:
    """One row per (part, method), then the mean rows; then R@1 per category where it was computed; then the
    parameters chosen on val and the submission files written."""
    rows = {(part, name): m for part, e in results["parts"].items() for name, m in e["methods"].items()}
    rows.update({("mean", name): m for name, m in results.get("mean", {}).items()})
    lines = [f"{results['benchmark']} {results['split']}"
             + (f", backbone {results['backbone']}" if results.get("backbone") else "") + ": "
             + ", ".join(f"{p}: {e['queries']} queries / {e['gallery']} gallery"
                         + (f" ({e['discarded']} discarded)" if e["discarded"] else "")
                         for p, e in results["parts"].items()), ""]
    if not any(rows.values()):
        lines.append("no ground truth in this split: no metrics")
    else:
        cols = list(dict.fromkeys(k for m in rows.values() for k in m))
        lines.append(markdown_table(["part", "method", *cols],
                                    [[part, name, *(f"{m[c]:.2f}" if c in m else "-" for c in cols)]
                                     for (part, name), m in rows.items()]))
    for part, e in results["parts"].items():
        if e.get("R@1_by_category"):
            lines += ["", f"R@1 by category ({part}):", "", metrics_table(e["R@1_by_category"])]
    lines += [f"chosen on val: {what} = {value}" for what, value in results.get("chosen", {}).items()]
    lines += [f"UNVERIFIED (--unverified): {what} records no backbone; these numbers were not checked to come from "
              "the features' backbone" for what in results.get("unverified", [])]
    if results.get("chosen") and results.get("split") == "val":
        lines.append("note: " + CHOSEN_ON_SCORED_SPLIT)
    return "\n".join(lines + [f"submission: {p}" for p in results.get("submissions", [])])
