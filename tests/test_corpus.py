"""The offline corpus for distillation: which files it reads, in a fixed order, and clear errors."""

from __future__ import annotations

import pytest

from edgespec.apps.distill import corpus
from edgespec.runtime.errors import EdgeSpecError


def test_python_corpus_is_the_standard_library_without_tests_or_site_packages():
    docs = corpus.documents("python")
    ids = [d.id for d in docs]
    assert len(docs) > 100  # the standard library has hundreds of modules over 1.5 KB
    assert any(i == "argparse.py" for i in ids)
    assert not any("site-packages" in i or i.split("/")[0] in ("test", "tests") for i in ids)
    assert all(corpus.MIN_BYTES <= d.path.stat().st_size <= corpus.MAX_BYTES for d in docs)


def test_order_is_fixed_by_seed():
    a = [d.id for d in corpus.documents("python", seed=1)]
    assert a == [d.id for d in corpus.documents("python", seed=1)]
    assert a != [d.id for d in corpus.documents("python", seed=2)]
    assert sorted(a) == sorted(d.id for d in corpus.documents("python", seed=2))


def test_a_folder_of_text_files(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n" * 400)
    (tmp_path / "small.py").write_text("y = 2\n")  # under MIN_BYTES
    (tmp_path / "blob.bin").write_bytes(b"\0" * 5000)  # not text by suffix
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.md").write_text("# notes\n" + "words " * 400)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "c.py").write_text("z = 3\n" * 400)
    got = sorted(i for i, _ in corpus.stream(str(tmp_path)))
    assert got == ["a.py", "sub/notes.md"]


def test_one_file_and_errors(tmp_path):
    f = tmp_path / "book.txt"
    f.write_text("short")
    assert [i for i, _ in corpus.stream(str(f))] == ["book.txt"]
    with pytest.raises(EdgeSpecError, match="no such file or folder"):
        corpus.documents(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EdgeSpecError, match="no text files"):
        corpus.documents(str(tmp_path / "empty"))
