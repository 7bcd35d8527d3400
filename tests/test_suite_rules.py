"""The suite's own run rules (tests/conftest.py), each shown to catch what it is for: a shared fixture is built once
per run and a failed build is not trusted; a test that writes into a shared folder is caught; two workers never get
the same port; one test's environment, working folder and thread count never reach the next; `--order` orders (the
slow tests first by default)."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import conftest

pytest_plugins = ["pytester"]


class _Factory:
    """The part of pytest's tmp_path_factory that `_shared` uses, over a folder of our own."""

    def __init__(self, base: Path):
        self.base = base / "popen-gw0"
        self.base.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str) -> Path:
        self.n += 1
        p = self.base / f"{name}{self.n}"
        p.mkdir()
        return p


def test_a_shared_fixture_is_built_once_per_run_and_a_failed_build_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.delenv("FOCO_TEST_SHARED", raising=False)
    factory, calls = _Factory(tmp_path), []

    def failing(out):
        (out / "half").write_text("x")
        raise RuntimeError("the build broke")

    with pytest.raises(RuntimeError):
        conftest._shared(factory, "thing", failing)

    def build(out):
        calls.append(out)
        (out / "data").write_text("built")
    a = conftest._shared(factory, "thing", build)
    b = conftest._shared(factory, "thing", build)  # a second worker, later: reads what the first built
    assert a == b and len(calls) == 1
    assert not (a / "half").exists()  # the failed build's leftovers were removed before building again
    assert (a / "data").read_text() == "built"
    assert a.parent.parent == tmp_path  # in the run's folder, beside the workers' own


def test_per_worker_mode_builds_in_every_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("FOCO_TEST_SHARED", "worker")
    factory, calls = _Factory(tmp_path), []
    conftest._shared(factory, "thing", calls.append)
    conftest._shared(factory, "thing", calls.append)
    assert len(calls) == 2 and calls[0] != calls[1]


def test_the_fingerprint_catches_a_write_into_a_shared_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.png").write_bytes(b"12345")
    (tmp_path / "store.sqlite").write_bytes(b"db")
    before = conftest._fingerprint(tmp_path)
    (tmp_path / "store.sqlite-wal").write_bytes(b"a reader's side file")  # SQLite's own, made by any reader
    assert conftest._fingerprint(tmp_path) == before
    (tmp_path / "sub" / "new.json").write_text("{}")  # a test's write: caught
    assert conftest._fingerprint(tmp_path) != before
    (tmp_path / "sub" / "new.json").unlink()
    assert conftest._fingerprint(tmp_path) == before
    (tmp_path / "sub" / "a.png").write_bytes(b"54321")  # same size, rewritten: the mtime moves
    os.utime(tmp_path / "sub" / "a.png", ns=(1, 1))
    assert conftest._fingerprint(tmp_path) != before


def test_ports_are_never_handed_out_twice_in_a_run(free_port):
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20 and all(1024 <= p < 65536 for p in ports)


def _inner_suite(pytester) -> None:
    """A small suite run by the real conftest: tests that leak state, and a log of the order they ran in."""
    pytester.makeconftest((Path(conftest.__file__)).read_text())
    pytester.makepyfile(test_inner=textwrap.dedent("""
        import os
        import pytest
        import torch

        def _log(name):
            with open(os.environ["ORDER_LOG"], "a") as f:
                f.write(name + "\\n")

        def test_a_leaks():
            _log("a")
            os.environ["FOCO_LEAK_PROBE"] = "1"
            os.chdir("/")
            torch.set_num_threads(1)

        def test_b_sees_no_leak():
            _log("b")
            assert "FOCO_LEAK_PROBE" not in os.environ
            assert os.getcwd() != "/"
            assert torch.get_num_threads() == int(os.environ["EXPECTED_THREADS"])

        def test_c():
            _log("c")

        @pytest.mark.slow
        def test_d_slow():
            _log("d")
    """))


@pytest.mark.slow  # over 5 s (issue 53: make test-fast within 2 minutes)
def test_a_test_leaves_no_state_to_the_next_and_the_order_option_orders(pytester, monkeypatch, tmp_path):
    torch_threads = 2  # the inner run starts with 2 threads, and its first test sets 1: a leak would show
    _inner_suite(pytester)
    log = tmp_path / "order.txt"
    monkeypatch.setenv("ORDER_LOG", str(log))
    monkeypatch.setenv("EXPECTED_THREADS", str(torch_threads))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the inner run is one process of its own
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch_threads))
    monkeypatch.setenv("MKL_NUM_THREADS", str(torch_threads))
    for order, expected in (("given", "abcd"), ("slow-first", "dabc"), ("reverse", "dcba")):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--order", order)
        result.assert_outcomes(passed=4)
        assert log.read_text().split() == list(expected), order
        log.unlink()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")  # the default
    assert log.read_text().split() == list("dabc")


def test_a_write_into_a_shared_folder_fails_the_run(pytester, monkeypatch):
    pytester.makeconftest(Path(conftest.__file__).read_text() + textwrap.dedent("""

        @pytest.fixture(scope="session")
        def shared_thing(tmp_path_factory):
            def build(out):
                (out / "data.txt").write_text("built")
            return _shared(tmp_path_factory, "thing", build)
    """))
    pytester.makepyfile(test_inner=textwrap.dedent("""
        def test_writes(shared_thing):
            (shared_thing / "extra.txt").write_text("a test's own file, in the shared folder")
    """))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*wrote into a shared fixture's folder*"])
