"""Earlier answers kept between runs (service/answer_files.py): they come back within the cap; a
damaged line costs only that line (a crash mid-append, a full disk); a file that is not an answers
file, or for another model or format version, is ignored in one line; one process writes a file
while a second reads it and keeps its own answers in memory; a folder in the file's place is said in
one line and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgespec.core.drafters.answer_store import AnswerStore, model_id
from edgespec.service.answer_files import AnswerFiles
from tests.conftest import ROOT


def store_in(folder: Path, cap: int = 1000) -> AnswerStore:
    return AnswerStore(cap=cap, files=AnswerFiles(folder))


def records_in(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()[1:]]


def test_persisted_answers_come_back_within_the_cap(smollm2, tmp_path):
    store = store_in(tmp_path)
    cache = store.cache(smollm2, "alice")
    for i in range(60):  # 60 x 42 tokens: the file is compacted at twice the cap
        cache.add([1, 2, 3], [500 + i] * 40)
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) == 1 and (files[0].stat().st_mode & 0o777) == 0o600
    assert sum(len(r["answer"]) for r in records_in(files[0])) <= 2 * 1000
    store.clear()  # releases the file
    again = store_in(tmp_path).cache(smollm2, "alice")
    assert 0 < again.tokens <= 1000
    assert again.view().match([1, 2, 3, 559])[0] == 4  # the newest answer is back
    assert store_in(tmp_path).cache(smollm2, "bob").tokens == 0


@pytest.mark.parametrize("content, why", [
    ("not json at all\n", "not an EdgeSpec answers file"),
    ("\x00\x01binary\xff\n", "not an EdgeSpec answers file"),
    ('{"hello": "world"}\n', "not an EdgeSpec answers file"),
    ('{"format": "edgespec-answers", "version": 1, "model": "MODEL"}\n{"lead": [1], "answer": [2, 3\n',
     "dropped 1 damaged line (corrupt at line 2"),
    ('{"format": "edgespec-answers", "version": 1, "model": "MODEL"}\n{"lead": [1], "answer": [99999999, 1, 2, 3]}\n',
     "dropped 1 damaged line (corrupt at line 2"),
    ('{"format": "edgespec-answers", "version": 1, "model": "other.gguf:1:2"}\n{"lead": [1], "answer": [2, 3, 4, 5]}\n',
     "made for another model"),
    ('{"format": "edgespec-answers", "version": 7, "model": "MODEL"}\n', "format version 7"),
])
def test_a_corrupt_or_foreign_file_is_ignored_with_one_line(smollm2, tmp_path, capsys, content, why):
    store = store_in(tmp_path)
    path = store.cache(smollm2, "alice").log.path
    store.clear()
    path.write_bytes(content.replace("MODEL", model_id(smollm2)).encode("latin-1"))
    cache = store.cache(smollm2, "alice")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and str(path) in err, err
    assert "JSONDecodeError" not in err or "line 2" in err  # not "corrupt at line 1 (JSONDecodeError ...)"
    assert cache.tokens == 0
    cache.add([1, 2], [10, 11, 12, 13])  # the next answer writes the file afresh
    store.clear()
    assert store_in(tmp_path).cache(smollm2, "alice").tokens > 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("cut", [20, 1], ids=["crash mid-append", "only the newline lost"])
def test_a_torn_last_line_costs_that_line_only(smollm2, tmp_path, capsys, cut):
    """Issue 44: a full disk or a crash mid-append left a partial last line, and the whole file was
    thrown away (21 good answers lost). The valid records stay; the next answer rewrites the file."""
    store = store_in(tmp_path)
    cache = store.cache(smollm2, "alice")
    for i in range(22):
        cache.add([1, 2], [600 + i, 7, 8, 9, 10])
    path = cache.log.path
    store.clear()
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    cache = store_in(tmp_path).cache(smollm2, "alice")
    err = capsys.readouterr().err
    kept = 21 if cut > 1 else 22  # without its newline the last record is whole
    assert cache.view().records == kept
    if cut > 1:
        assert err.count("\n") == 1 and f"kept 21 earlier answers in {path} and dropped 1 damaged line" in err, err
    else:
        assert err == ""
    assert cache.view().match([1, 2, 620])[0] == 3  # an answer from before the tear
    cache.add([1, 2], [700, 7, 8, 9, 10])
    recs = records_in(path)  # every line whole again
    assert len(recs) == kept + 1 and recs[-1]["answer"][0] == 700


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from edgespec.service.answer_files import AnswerFiles
    log = AnswerFiles(Path(sys.argv[1])).open(sys.argv[2], "alice", 49152, 1000)
    print("holding", log.writable, flush=True)
    sys.stdin.readline()
""")


def test_a_second_process_reads_the_file_but_never_writes_it(smollm2, tmp_path, capsys):
    """Issue 44: two servers sharing --answers-persist each compacted the file from their own memory
    (11 lines -> 2) and grew it past the 2x cap. One process holds a file's lock; another reads the
    answers, keeps its new ones in memory and says so in one line; once the first lets go, it writes."""
    store = store_in(tmp_path)
    cache = store.cache(smollm2, "alice")
    for i in range(11):
        cache.add([1, 2], [600 + i, 7, 8, 9, 10])
    path = cache.log.path
    store.clear()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), model_id(smollm2)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().split() == ["holding", "True"]
        before = path.read_bytes()
        second = store_in(tmp_path, cap=40)  # a small cap: it would compact at once if it wrote
        cache = second.cache(smollm2, "alice")
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"another process keeps the earlier answers in {path}" in err
        assert cache.view().records > 0  # read all the same
        for i in range(5):
            cache.add([1, 2], [800 + i, 7, 8, 9, 10])
        assert path.read_bytes() == before  # the first process's file, untouched
        second.clear()
    finally:
        holder.communicate("\n", timeout=60)
    third = store_in(tmp_path)
    third.cache(smollm2, "alice").add([1, 2], [900, 7, 8, 9, 10])
    assert len(records_in(path)) == 12 and capsys.readouterr().err == ""


def test_a_folder_in_the_files_place_is_said_once_and_leaves_nothing(smollm2, tmp_path, capsys):
    """Issue 44 (35): a persist path that is a folder left `<name>.tmp` behind."""
    store = store_in(tmp_path)
    path = store.cache(smollm2, "alice").log.path
    store.clear()
    path.mkdir()
    cache = store_in(tmp_path).cache(smollm2, "alice")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} is a folder, not an answers file" in err
    cache.add([1, 2], [10, 11, 12, 13])
    assert cache.view().records == 1  # kept in memory
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert capsys.readouterr().err == ""
