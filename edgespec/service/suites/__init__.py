"""Prompt suites: JSONL files, one prompt per line, read by the bench, `distill` and the UI's bench tab.

Two line formats are accepted:
  ours        {"id": ..., "category": ..., "prompt": "..."}, optionally with "system" (the system
              message an agent sends with it), "max_tokens" (the answer's budget), "kind" (a finer
              class for reports), "session" (requests of one agent session, in file order),
              "schema" (the JSON schema of the answer, for a constrained run's `response_format`)
              and "tools" (OpenAI function definitions, for a constrained run's `tools`)
  Spec-Bench  {"question_id": ..., "category": ..., "turns": ["...", ...]}  (only the first turn is
              used: the benchmark measures single-turn decoding)
Every problem is reported as one line naming the file and the line number.

The suites that ship with EdgeSpec are package data of this package, found with
importlib.resources (`shipped_suites`), so they are found from an installed copy as well;
`--suite NAME` names one of them by its file name without `.jsonl`. How a prompt is fed to a model
is the session's framing (`edgespec.service.session.frame`; the bench and distill ask with 'question').
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from edgespec.runtime.errors import EdgeSpecError


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    source: str  # "file:line", for messages
    system: str | None = None
    max_tokens: int | None = None
    kind: str | None = None
    session: str | None = None
    schema: dict | None = field(default=None, hash=False)  # the answer's JSON schema (constrained runs)
    tools: tuple[dict, ...] | None = field(default=None, hash=False)  # OpenAI tools (constrained runs)


def _parse_line(obj: object, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise EdgeSpecError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "prompt" in obj:
        pid, text = obj.get("id"), obj["prompt"]
        if pid is None:
            raise EdgeSpecError(f"{where}: missing field 'id'")
    elif "turns" in obj:
        pid, turns = obj.get("question_id", obj.get("id")), obj["turns"]
        if pid is None:
            raise EdgeSpecError(f"{where}: missing field 'question_id' (Spec-Bench format)")
        if not isinstance(turns, list) or not turns:
            raise EdgeSpecError(f"{where}: 'turns' must be a non-empty list of strings")
        text = turns[0]
    else:
        raise EdgeSpecError(f"{where}: missing field 'prompt' (or Spec-Bench 'turns')")
    if "category" not in obj:
        raise EdgeSpecError(f"{where}: missing field 'category'")
    category = obj["category"]
    if not isinstance(category, str) or not category.strip():
        raise EdgeSpecError(f"{where}: 'category' must be a non-empty string")
    if not isinstance(text, str):
        raise EdgeSpecError(f"{where}: the prompt must be a string, got {type(text).__name__}")
    if not text.strip():
        raise EdgeSpecError(f"{where}: the prompt is empty")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool):
        raise EdgeSpecError(f"{where}: the id must be a string or an integer")
    for name in ("system", "kind", "session"):
        if name in obj and (not isinstance(obj[name], str) or not obj[name].strip()):
            raise EdgeSpecError(f"{where}: {name!r} must be a non-empty string")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise EdgeSpecError(f"{where}: 'max_tokens' must be a whole number >= 1")
    schema = obj.get("schema")
    if schema is not None and (not isinstance(schema, dict) or not schema):
        raise EdgeSpecError(f"{where}: 'schema' must be a JSON schema (a non-empty object)")
    tools = obj.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            raise EdgeSpecError(f"{where}: 'tools' must be a non-empty list of OpenAI tools")
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                    or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise EdgeSpecError(f"{where}: tools[{i}] must be {{\"type\": \"function\", \"function\": "
                                    f"{{\"name\": ..., \"parameters\": ...}}}}")
        tools = tuple(tools)
    return Prompt(str(pid), category.strip(), text, where, obj.get("system"), max_tokens, obj.get("kind"),
                  obj.get("session"), schema, tools)


def shipped_suites() -> dict[str, Path]:
    """The suites shipped as package data, by name (file name without .jsonl)."""
    folder = resources.files(__name__)
    found = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".jsonl") and entry.is_file():
            found[entry.name.removesuffix(".jsonl")] = Path(str(entry))
    return dict(sorted(found.items()))


def suite_path(name: str | Path) -> Path:
    """A suite file: a path, or the name of a shipped suite when no such file exists."""
    p = Path(name).expanduser()
    if not p.exists() and str(name) in (shipped := shipped_suites()):
        return shipped[str(name)]
    return p


def load_suite(path: str | Path) -> list[Prompt]:
    """Read one JSONL suite file (or shipped suite by name); blank lines are skipped, anything else
    must be a prompt."""
    p = suite_path(path)
    if not p.is_file():
        raise EdgeSpecError(f"suite file not found: {p}")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise EdgeSpecError(f"suite file is not UTF-8 text: {p}") from None
    prompts = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}:{i}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EdgeSpecError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        prompts.append(_parse_line(obj, where))
    if not prompts:
        raise EdgeSpecError(f"suite file has no prompts: {p}")
    return prompts


def load_suites(
    paths: Sequence[str | Path], categories: Sequence[str] = (), per_category: int | None = None
) -> list[Prompt]:
    """Read suites, keep the asked categories (all if none) and the first `per_category` of each."""
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for path in paths:
        for pr in load_suite(path):
            if pr.id in seen:
                raise EdgeSpecError(f"{pr.source}: duplicate id {pr.id!r} (first at {seen[pr.id]})")
            seen[pr.id] = pr.source
            prompts.append(pr)
    known = sorted({pr.category for pr in prompts})
    for c in categories:
        if c not in known:
            raise EdgeSpecError(f"no prompts in category {c!r}; the suites have: {', '.join(known)}")
    if categories:
        prompts = [pr for pr in prompts if pr.category in categories]
    if per_category is not None:
        if per_category < 1:
            raise EdgeSpecError(f"--per-category must be >= 1, got {per_category}")
        count: dict[str, int] = {}
        kept = []
        for pr in prompts:
            count[pr.category] = count.get(pr.category, 0) + 1
            if count[pr.category] <= per_category:
                kept.append(pr)
        prompts = kept
    return prompts


GROUNDED = ("summarization", "rag", "extraction", "code_edit")


def grounded_prompts(per_category: int = 2) -> list[Prompt]:
    """The bench's grounded prompts, as `app.py bench --suite spec_bench --suite code_edit
    --category summarization --category rag --category extraction --category code_edit
    --per-category N` selects them."""
    return load_suites(["spec_bench", "code_edit"], GROUNDED, per_category)
