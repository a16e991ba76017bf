"""Earlier answers kept between runs (`serve --answers-persist`): the files behind the suffix drafter's
in-memory store (core/drafters/answer_store.py). One file per model and owner under
EDGESPEC_CACHE/answers, 0600 in a 0700 folder: a header line, then one JSON record a line, appended
as answers come and written afresh from the cache's records when it reaches twice the cap.

- A damaged line (a write cut short by a crash or a full disk) costs that line only: the records
  before and after it are kept, and the file is written afresh with the next answer.
- One writer per file: a process holds an exclusive lock (flock on `<name>.lock`) on every file it
  writes, for as long as it keeps that cache. A second process (another server on the same cache
  folder) reads the answers but keeps its new ones in memory only, saying so in one line, so
  neither rewrites the file from its own memory and deletes the other's answers.
- What cannot be used (a folder where the file should be, a file that is no answers file, an
  unwritable folder) is one line on stderr, and the answers stay in memory.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from hashlib import sha256
from pathlib import Path

from edgespec.core.drafters.answer_store import Record
from edgespec.runtime import firstrun

try:
    import fcntl
except ImportError:  # Windows: no flock; one process per cache folder is the user's to keep
    fcntl = None

FORMAT = "edgespec-answers"
VERSION = 1


def default_folder() -> Path:
    """EDGESPEC_CACHE/answers (~/.cache/edgespec/answers)."""
    return firstrun.cache_dir() / "answers"


class AnswerFiles:
    """The files of every (model, owner) cache in `folder` (core's `AnswerFiles` protocol)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def open(self, model: str, owner: str, n_vocab: int, cap: int) -> AnswerFile:
        name = sha256(f"{model}\0{owner}".encode()).hexdigest()[:24]
        return AnswerFile(self.folder / f"{name}.jsonl", model, n_vocab, cap)


class AnswerFile:
    """One cache's file (core's `AnswerLog` protocol): `load` once, then `append` per answer."""

    def __init__(self, path: Path, model: str, n_vocab: int, cap: int) -> None:
        self.path = path
        self.model = model
        self.n_vocab = n_vocab
        self.cap = cap
        self.readable = self.writable = True
        self._lock_fd: int | None = None
        self._tokens = 0  # tokens in the file (written afresh at twice the cap)
        self._afresh = False  # the file must be written afresh before anything is appended
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            self._memory_only(f"cannot use {path} ({exc.strerror or exc})")
            return
        if mode is not None and not stat.S_ISREG(mode):
            self._memory_only(f"{path} is {'a folder' if stat.S_ISDIR(mode) else 'not a regular file'}, "
                              "not an answers file")
            return
        self._lock()

    # ------------------------------------------------------------------ one writer
    def _lock(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            self.writable = False
            _say(f"cannot keep earlier answers in {self.path.parent} ({exc.strerror or exc}); "
                 "keeping new ones in memory only")
            return
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                self.writable = False
                _say(f"another process keeps the earlier answers in {self.path}; this one reads them and keeps "
                     "its new answers in memory only")
                return
        self._lock_fd = fd

    def close(self) -> None:
        """Release the file (its lock): another process may write it now."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None
        self.writable = False

    def _memory_only(self, why: str) -> None:
        self.readable = self.writable = False
        _say(f"{why}; keeping earlier answers in memory only")

    # ------------------------------------------------------------------ reading
    def load(self) -> list[Record]:
        """The records in the file, oldest first; damaged lines are left out (one line says how many)."""
        if not self.readable:
            return []
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            return self._ignore(f"unreadable ({exc.strerror or exc})")
        lines = data.split(b"\n")
        header = _json(lines[0])
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            return self._ignore("not an EdgeSpec answers file")
        if header.get("version") != VERSION:
            return self._ignore(f"format version {header.get('version')!r}, this EdgeSpec reads {VERSION}")
        if header.get("model") != self.model:
            return self._ignore(f"made for another model ({header.get('model')!r})")
        body = lines[1:]
        if body and body[-1] == b"":
            body.pop()  # the newline that ends the last record
        elif body:
            self._afresh = True  # a last line without its newline: the next append would join it
        records: list[Record] = []
        damaged: list[tuple[int, str]] = []
        for line_no, line in enumerate(body, 2):
            try:
                records.append(self._record(line))
            except (ValueError, KeyError, TypeError) as exc:
                damaged.append((line_no, f"{type(exc).__name__}: {exc}"))
        if damaged:
            self._afresh = True
            line_no, why = damaged[0]
            _say(f"kept {len(records)} earlier answers in {self.path} and dropped {len(damaged)} damaged "
                 f"line{'s' if len(damaged) > 1 else ''} (corrupt at line {line_no}: {why})")
        self._tokens = sum(len(lead) + len(answer) for lead, answer in records)
        return records

    def _record(self, line: bytes) -> Record:
        obj = json.loads(line)
        lead, answer = obj["lead"], obj["answer"]
        if not (_tokens_ok(lead, self.n_vocab) and _tokens_ok(answer, self.n_vocab)) or not answer:
            raise ValueError("token ids out of the model's vocabulary")
        return lead, answer

    def _ignore(self, why: str) -> list[Record]:
        _say(f"ignoring the earlier answers in {self.path}: {why}")
        self._afresh = True
        return []

    # ------------------------------------------------------------------ writing
    def append(self, record: Record, current: Sequence[Record]) -> None:
        """Append `record`; or, where the file is damaged, foreign or at twice the cap, write it afresh
        with `current` (the cache's records, `record` among them)."""
        if not self.writable:
            return
        lead, answer = record
        try:
            if self._afresh or self._tokens + len(lead) + len(answer) > 2 * self.cap:
                self._write(current)
                return
            new = not self.path.exists()
            with _append(self.path) as f:
                if new:
                    f.write(self._header())
                f.write(json.dumps({"lead": lead, "answer": answer}) + "\n")
            self._tokens += len(lead) + len(answer)
        except OSError as exc:
            self.close()
            _say(f"cannot keep earlier answers in {self.path} ({exc.strerror or exc}); keeping new ones in memory only")

    def _write(self, records: Sequence[Record]) -> None:
        """The file afresh: a temporary file beside it (0600) renamed over it, removed if anything fails."""
        fd, name = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self._header())
                for lead, answer in records:
                    f.write(json.dumps({"lead": lead, "answer": answer}) + "\n")
            os.replace(name, self.path)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        self._tokens = sum(len(lead) + len(answer) for lead, answer in records)
        self._afresh = False

    def _header(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "model": self.model}) + "\n"


def _append(path: Path):  # noqa: ANN202 - a text file object
    """Open a file for appending that only its owner may read (answers can hold anything a user sent)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a", encoding="utf-8")


def _json(line: bytes) -> object:
    try:
        return json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return None


def _tokens_ok(tokens: object, n_vocab: int) -> bool:
    return isinstance(tokens, list) and all(type(t) is int and 0 <= t < n_vocab for t in tokens)


def _say(line: str) -> None:
    print(f"edgespec: {line}", file=sys.stderr)
