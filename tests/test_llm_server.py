"""Against a real OpenAI-compatible server (llama-cpp-python + a small GGUF model): run by experiments/llm_server.sh,
which starts the server and sets FOCO_LLM_URL. Skipped when no server is configured (as in `make test`)."""
import json
import os
import urllib.request

import pytest

URL = os.environ.get("FOCO_LLM_URL", "")


def _reachable() -> bool:
    if not URL:
        return False
    try:
        with urllib.request.urlopen(URL.rstrip("/") + "/models", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _reachable(), reason="no OpenAI-compatible server at FOCO_LLM_URL "
                                                          "(experiments/llm_server.sh starts one)")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if os.environ.get("FOCO_TEST_WORLD"):
        return os.environ["FOCO_TEST_WORLD"]
    from foco.cli import main
    out = tmp_path_factory.mktemp("w") / "tiny"
    assert main(["world", "generate", "--out", str(out), "--size", "tiny"]) == 0
    return out


def test_real_server_decomposes_world_captions(world, tmp_path, capsys):
    from foco.cli import main
    from foco.decompose import DecompositionStore
    from foco.decompose.inputs import read_captions
    from foco.decompose.prompt import parse_answer
    store = tmp_path / "llm.sqlite"
    argv = ["decompose", "--in", str(world), "--out", str(store), "--decomposer", "llm", "--limit", "12",
            "--min-pairs", "1", "--concurrency", "1", "--timeout", "120"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    captions = list(dict.fromkeys(r.caption for r in read_captions(world)[:12]))
    with DecompositionStore(store) as s:
        sid = s.resolve("llm")
        got = s.get_many(sid, captions)
        flagged = s.flagged(sid)
    assert flagged < len(captions) / 2, printed  # the model itself answers most captions validly
    for caption, d in got.items():
        assert 1 <= len(d.pairs) <= 5
        if not d.flag:  # what the model answered passed the strict parser: re-check it independently
            parse_answer(json.dumps({"pairs": [{"local": p.local, "context": p.context} for p in d.pairs]}),
                         caption, 1, 5)
    assert main(argv) == 0  # a rerun finds everything done
    assert f"{len(captions)} already in the store" in capsys.readouterr().out
