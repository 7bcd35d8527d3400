"""Reliability (issue 13, finding 1): an unreachable LLM server is a configuration error. `foco decompose` stops
with exit 2 and a message naming the URL and --llm-url, and stores nothing under the llm settings (it used to fall
back to the rule decomposer for every caption, with exit 0)."""
from __future__ import annotations

import json
import sqlite3

from foco.cli import main


def test_a_refused_llm_server_stops_the_job_and_stores_nothing(tmp_path, capsys):
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps({"id": i, "caption": f"a red circle {i}"}) + "\n" for i in range(5)))
    store = tmp_path / "s.sqlite"
    code = main(["decompose", "--in", str(f), "--out", str(store), "--decomposer", "llm", "--llm-url",
                 "http://127.0.0.1:9/v1", "--retries", "1", "--backoff", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "127.0.0.1:9" in err and "--llm-url" in err
    if store.exists():
        with sqlite3.connect(store) as db:
            assert db.execute("SELECT COUNT(*) FROM decompositions").fetchone()[0] == 0
