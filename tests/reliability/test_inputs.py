"""Reliability (issue 13, findings 4 and 8): a caption table whose caption column has an unknown name is refused
with the file, the line and the flag that fixes it, never decomposed with its header as data; `--limit 0` is refused
rather than read as "no limit"."""
from __future__ import annotations

import pytest

from foco.cli import main
from foco.decompose.inputs import read_captions
from foco.utils.io import ManifestError


def test_an_unknown_caption_header_is_refused_by_name(tmp_path, capsys):
    f = tmp_path / "caps.csv"
    f.write_text("url,description\nhttp://x/1.jpg,a red circle\nhttp://x/2.jpg,a blue star\n")
    with pytest.raises(ManifestError, match=r"caps.csv:1: .*looks like a header.*--caption-column"):
        read_captions(f)
    recs = read_captions(f, caption_column="description")
    assert [(r.id, r.caption) for r in recs] == [("http://x/1.jpg", "a red circle"), ("http://x/2.jpg", "a blue star")]
    assert main(["decompose", "--in", str(f), "--out", str(tmp_path / "s.sqlite"), "--decomposer", "rule"]) == 2
    assert "--caption-column" in capsys.readouterr().err
    assert not (tmp_path / "s.sqlite").exists()  # nothing was written
    with pytest.raises(ManifestError, match="not in the header"):
        read_captions(f, caption_column="alt_text")


def test_headerless_tables_still_read_either_way_round(tmp_path):
    a = tmp_path / "a.tsv"
    a.write_text("a red circle\thttp://x/1.jpg\na blue star\thttp://x/2.jpg\n")
    b = tmp_path / "b.csv"
    b.write_text("images/1.png,a red circle\nimages/2.png,a blue star\n")
    assert [r.caption for r in read_captions(a)] == [r.caption for r in read_captions(b)] == \
        ["a red circle", "a blue star"]
    c = tmp_path / "c.csv"
    c.write_text("a red circle,a blue star\na green one,a yellow one\n")  # no id anywhere
    with pytest.raises(ManifestError, match="id column"):
        read_captions(c)


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_limit_must_be_positive(limit, tmp_path, capsys):
    f = tmp_path / "c.jsonl"
    f.write_text('{"id": 1, "caption": "a red circle"}\n')
    with pytest.raises(SystemExit):
        main(["decompose", "--in", str(f), "--out", str(tmp_path / "s.sqlite"), "--limit", limit])
    assert "positive count" in capsys.readouterr().err


def test_every_option_of_every_command_says_what_it_is():
    """Finding 8: --world, --size, --seed and --device had no help text; now no option of any command lacks one."""
    import argparse
    from foco.cli import build_parser
    missing = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(p, f"{name} {sub}")
            elif action.option_strings and action.help is None and "-h" not in action.option_strings:
                missing.append(f"{name} {action.option_strings[-1]}")
    walk(build_parser(), "foco")
    assert not missing, missing


def test_eval_refuses_an_unwritable_out_before_any_work(tmp_path, capsys):
    """Finding 8: `eval --out` was checked only after the whole evaluation; now before anything is read."""
    import os
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores the mode bits: use a folder given as --out instead
            bad = tmp_path
        else:
            bad = ro / "r.json"
        code = main(["eval", "--benchmark", "cirr", "--root", str(tmp_path / "missing"), "--out", str(bad)])
    finally:
        os.chmod(ro, 0o700)
    err = capsys.readouterr().err
    assert code == 2 and "--out" in err and "missing" not in err  # refused before the benchmark was looked at


def test_decompose_defaults_to_what_the_input_allows(tmp_path, capsys):
    """Finding 8: `decompose` defaulted to oracle, which only works on world inputs; a plain caption file now gets
    the rule decomposer, and says so."""
    f = tmp_path / "c.jsonl"
    f.write_text('{"id": 1, "caption": "a red circle next to a blue star"}\n')
    assert main(["decompose", "--in", str(f), "--out", str(tmp_path / "s.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "decomposer: rule" in out and "--decomposer rule" in out


def test_a_latin1_file_names_its_file_and_line(tmp_path):
    """Finding 8: a Latin-1 CSV gave a decode error naming neither file nor line."""
    f = tmp_path / "caps.csv"
    f.write_bytes("url,caption\nhttp://x/1.jpg,a red circle\nhttp://x/2.jpg,a caf\xe9 on a street\n".encode("latin-1"))
    with pytest.raises(ManifestError, match=r"caps.csv:3: not UTF-8.*re-save"):
        read_captions(f)


def test_a_very_long_caption_is_data(tmp_path):
    """Finding 8: a 300 kB caption gave `_csv.Error: field larger than field limit`."""
    f = tmp_path / "caps.tsv"
    long = "a red circle " * 25_000  # ~325 kB
    f.write_text(f"caption\tid\n{long}\tx/1.jpg\na blue star\tx/2.jpg\n")
    recs = read_captions(f)
    assert len(recs) == 2 and recs[0].caption == long.strip()
    import csv
    assert csv.field_size_limit() == 131072  # the process-wide limit is restored
