"""Offline training text for `python app.py distill --corpus`: text that is already on this machine.

A learned drafter learns from the target's hidden states. Reading existing text gives them by
teacher forcing, in batched passes (prefill), where generating gives one token per pass; how much
faster that is depends on the CPU (README/docs: measured rates). `--corpus python` reads the
installed Python standard library (an offline code corpus every machine with this app has);
`--corpus PATH` reads a text file or the text files under a folder.

Documents come in a fixed pseudo-random order (by seed), so two runs read the same text, and
neither the prompt suites nor their held-out prompts are part of it.
"""

from __future__ import annotations

import codecs
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgespec.runtime.errors import EdgeSpecError

SUFFIXES = (".py", ".md", ".txt", ".rst", ".js", ".ts", ".c", ".h", ".cpp", ".rs", ".go", ".java", ".sh")
MIN_BYTES = 1500  # shorter files teach little per pass
MAX_BYTES = 400_000  # generated tables and vendored blobs
TEXT_CHECK = 64 << 10  # bytes of a file looked at to tell text from binary data
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib", "lib2to3", "turtledemo",
             "ensurepip", "encodings", "pydoc_data", "config-3"}


@dataclass(frozen=True)
class Document:
    id: str  # path relative to the corpus root
    path: Path

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


def python_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def not_text(path: Path) -> str | None:
    """Why the file at `path` is not training text, or None: its first TEXT_CHECK bytes must be
    UTF-8 without NUL bytes (random or binary data is neither; a multi-byte character cut at the
    end of the sample is fine)."""
    try:
        with path.open("rb") as f:
            head = f.read(TEXT_CHECK)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not head.strip():
        return "is empty"
    if b"\0" in head:
        return f"is binary, not text (a NUL byte at {head.index(0)})"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < TEXT_CHECK)
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 text (byte 0x{head[exc.start]:02x} at {exc.start})"
    return None


def resolve(spec: str) -> Path:
    """'python' -> the standard library folder; anything else is a path that must exist."""
    if spec == "python":
        return python_root()
    root = Path(spec).expanduser()
    if not root.exists():
        raise EdgeSpecError(f"--corpus {spec}: no such file or folder (use 'python' for the installed Python sources)")
    return root


def documents(spec: str, seed: int = 0) -> list[Document]:
    """The corpus's documents, in a fixed order shuffled by `seed`."""
    root = resolve(spec)
    if root.is_file():
        why = not_text(root)
        if why is not None:
            raise EdgeSpecError(f"--corpus {spec} {why}; give a text file, a folder of them, or 'python'")
        return [Document(root.name, root)]
    found = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith(".") or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if p.suffix not in SUFFIXES or not p.is_file() or p.name.startswith("test_"):
            continue
        try:
            size = p.stat().st_size
        except OSError:
            continue
        if MIN_BYTES <= size <= MAX_BYTES and not_text(p) is None:
            found.append(Document(str(rel), p))
    if not found:
        raise EdgeSpecError(f"--corpus {spec}: no text files ({', '.join(SUFFIXES[:4])}, ...) of "
                            f"{MIN_BYTES}-{MAX_BYTES} bytes under {root}")
    random.Random(seed).shuffle(found)
    return found


def stream(spec: str, seed: int = 0) -> Iterator[tuple[str, str]]:
    """(id, text) of each readable document, in `documents` order."""
    for doc in documents(spec, seed):
        try:
            text = doc.text()
        except OSError:
            continue
        if text.strip():
            yield doc.id, text
