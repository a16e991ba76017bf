"""llama.cpp's own speculative decoding as a bench reference: `llama-speculative-simple
--spec-type T` (ngram-simple, ngram-map-k, ngram-mod, ngram-cache), the same n-gram speculation
users get from `llama-server --spec-type T`, and its draft-model mode (`--spec-type draft-simple -md
DRAFT`, what `llama-server -md` runs): `draft-simple` with the program's defaults (n_max 3, n_min 0,
p_min 0), or tuned as `draft-simple/N_MAX/N_MIN/P_MIN` (e.g. draft-simple/4/3/0.5). This llama.cpp
needs the explicit --spec-type beside -md ("failed to initialize speculative decoding" otherwise).

The program is built by `bash scripts/build_reference.sh` from the llama.cpp sources vendored in
the project's llama-cpp-python release, and runs on the very shared libraries the project loads
(the CPU kernel modules included), so the two sides differ only in the speculation loop.

One run = one process: the prompt's tokens go in as text (special tokens written out; the program
tokenizes with parse_special and adds BOS, and the count it reports is checked against ours), greedy
sampling, the same threads, context and flash-attention setting. Tokens/s is the program's own
"decoded N tokens in S seconds" (time after the prompt pass, like the engine's `Stats.decode_s`).
The n-gram types draft with their own defaults, not --spec-draft-n-max (the program applies that to
draft models): up to 48 tokens after a 12-token key (ngram-simple, ngram-map-k), 48-64 after a
24-token match (ngram-mod), truncated only by what is left of -n.
With Gemma 3 (a sliding-window cache, which cannot drop single positions) the program verifies
through state checkpoints: it may then generate past `-n` (it finishes a restored draft first) and
its n_drafted/n_accept counters leave those steps out, so its rate is the measure, not its counts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgespec.runtime import env, firstrun
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model

SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
DRAFT_TYPE = "draft-simple"  # a draft model; '/N_MAX/N_MIN/P_MIN' tunes it
PREFIX = "llama.cpp "  # configuration names: 'llama.cpp ngram-simple', ...
BUILD_HINT = "bash scripts/build_reference.sh"


def parse_reference(spec: str) -> list[str]:
    """'llama.cpp:ngram-simple,draft-simple/4/3/0.5' (or 'llama.cpp' for every n-gram type) -> the types."""
    head, _, tail = spec.partition(":")
    if head.strip() != "llama.cpp":
        raise EdgeSpecError(f"--reference takes llama.cpp:TYPE[,TYPE...], got {spec!r}")
    types = [t.strip() for t in tail.split(",") if t.strip()] or list(SPEC_TYPES)
    for t in types:
        if t not in SPEC_TYPES:
            draft_settings(t)  # a bad type or tuning fails here, before any model loads
    return types


def draft_settings(spec_type: str) -> list[str]:
    """'draft-simple' -> [] (the program's defaults); 'draft-simple/4/3/0.5' -> its n_max, n_min and
    p_min flags. Anything else is a one-line error naming the choices."""
    name, *tune = spec_type.split("/")
    if name != DRAFT_TYPE or len(tune) not in (0, 3):
        raise EdgeSpecError(f"unknown llama.cpp speculation type {spec_type!r}; choose from "
                            f"{', '.join(SPEC_TYPES)}, {DRAFT_TYPE} or {DRAFT_TYPE}/N_MAX/N_MIN/P_MIN")
    if not tune:
        return []
    try:
        n_max, n_min, p_min = int(tune[0]), int(tune[1]), float(tune[2])
    except ValueError:
        raise EdgeSpecError(f"{spec_type!r}: want {DRAFT_TYPE}/N_MAX/N_MIN/P_MIN, e.g. {DRAFT_TYPE}/4/3/0.5") from None
    if not (1 <= n_max and 0 <= n_min <= n_max and 0.0 <= p_min <= 1.0):
        raise EdgeSpecError(f"{spec_type!r}: need 1 <= N_MAX, 0 <= N_MIN <= N_MAX and 0 <= P_MIN <= 1")
    return ["--spec-draft-n-max", str(n_max), "--spec-draft-n-min", str(n_min), "--spec-draft-p-min", str(p_min)]


def default_binary() -> Path:
    """Where build_reference.sh puts the program for the installed llama-cpp-python build."""
    if (given := env.path("EDGESPEC_LLAMA_SPECULATIVE")) is not None:
        return given
    try:  # the set-up writes the build key into the virtual environment it installed into
        key = (Path(sys.prefix) / ".llama-build-key").read_text().strip()
    except OSError:
        key = "unknown"
    folder = f"llama.cpp-{firstrun.LLAMA_CPP_VERSION}-{key}-noamx"  # built without the AMX kernels (the script)
    return firstrun.cache_dir() / "reference" / folder / "llama-speculative-simple"


def find_binary() -> Path | None:
    path = default_binary()
    return path if path.is_file() and os.access(path, os.X_OK) else None


@dataclass
class SpecRun:
    text: str
    n_predict: int  # tokens the program generated (its count, end-of-generation included)
    decode_s: float
    n_drafted: int
    n_accept: int

    @property
    def tokens_per_s(self) -> float:
        return self.n_predict / max(self.decode_s, 1e-9)


_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in")
_COUNT = re.compile(r"^(?:[0-9.]+ I )?\s*(n_drafted|n_accept)\s*=\s*(\d+)", re.M)  # lines may carry a timestamp


class LlamaCppSpeculative:
    """Runs `llama-speculative-simple` with one n-gram type, or a draft model, on the target file."""

    def __init__(self, binary: Path, target: Model, spec_type: str, *, draft_max: int = 16,
                 draft_model: Path | None = None, timeout_s: float = 600.0) -> None:
        if spec_type in SPEC_TYPES:
            self.spec_args = ["--spec-type", spec_type, "--spec-draft-n-max", str(draft_max)]
        else:
            if draft_model is None:
                raise EdgeSpecError(f"llama.cpp {spec_type} needs a draft model: give the bench --draft model:NAME "
                                    "or --reference-draft-model NAME")
            self.spec_args = ["--spec-type", DRAFT_TYPE, "-md", str(draft_model),
                              "-td", str(target.n_threads), "-tbd", str(target.n_threads), *draft_settings(spec_type)]
        self.binary = binary
        self.target = target
        self.spec_type = spec_type
        self.timeout_s = timeout_s
        self.name = PREFIX + spec_type

    def prompt_text(self, tokens: Sequence[int]) -> str:
        """Text the program tokenizes back into `tokens` (it adds BOS itself where the model wants one;
        Qwen and SmolLM2 do not)."""
        info = self.target.info
        if info.add_bos:
            if not (tokens and tokens[0] == info.bos):
                raise EdgeSpecError("the llama.cpp reference needs prompts that start with the model's BOS token")
            tokens = tokens[1:]
        return self.target.render_special(tokens)

    def generate(self, tokens: Sequence[int], max_tokens: int) -> SpecRun:
        t = self.target
        prompt = self.prompt_text(tokens)
        fa = {"on": "on", "off": "off"}.get(str(t.flash_attn), "auto")
        cmd = [
            str(self.binary), "-m", str(t.path), "-p", prompt, "-n", str(max_tokens),
            "-c", str(t.n_ctx), "-t", str(t.n_threads), "-tb", str(t.n_threads), "-fa", fa,
            "--temp", "0", *self.spec_args, "--seed", "1",
        ]
        env = dict(os.environ, LD_LIBRARY_PATH=str(self.binary.parent))
        try:
            proc = subprocess.run(cmd, capture_output=True, env=env, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise EdgeSpecError(f"{self.binary.name} ({self.spec_type}) took over {self.timeout_s:.0f} s") from None
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        dec = _DECODED.search(err)
        if proc.returncode != 0 or dec is None:
            last = next((ln for ln in reversed(err.strip().splitlines()) if ln.strip()), f"exit code {proc.returncode}")
            raise EdgeSpecError(f"{self.binary.name} ({self.spec_type}) failed: {last.strip()}")
        enc = _ENCODED.search(err)
        if enc is not None and int(enc.group(1)) != len(tokens):
            raise EdgeSpecError(
                f"{self.binary.name} tokenized the prompt to {enc.group(1)} tokens, EdgeSpec to {len(tokens)}"
            )
        counts = dict((k, int(v)) for k, v in _COUNT.findall(err))
        # stdout: "\n\n", the prompt's pieces (BOS written out), the generated text, "\n\n"
        start = out.find(prompt)
        text = out[start + len(prompt):] if start >= 0 else out
        if text.endswith("\n\n"):
            text = text[:-2]
        return SpecRun(text, int(dec.group(1)), float(dec.group(2)), counts.get("n_drafted", 0), counts.get("n_accept", 0))

    def close(self) -> None:
        pass  # one process per run: nothing stays open


def missing_message() -> str:
    return (
        f"llama.cpp reference skipped: no {default_binary().name} at {default_binary().parent} "
        f"(build it once with `{BUILD_HINT}`, 10-15 minutes; or set EDGESPEC_LLAMA_SPECULATIVE)"
    )


def main(argv: list[str]) -> int:
    """`python -m edgespec.runtime.llamacpp`: where the reference program is, or how to build it."""
    path = find_binary()
    if path is None:
        print(missing_message(), file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
