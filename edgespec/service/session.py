"""The session layer, between the engine and its consumers (CLI, web UI, bench, server).

Every consumer does the same three things, here and nowhere else:
  1. build a `Request` (prompt or conversation, framing, drafter, gamma, sampling) - from command
     line arguments (`apps.args.request_from_args`), or field by field from UI controls or a bench row;
  2. run it on a `Session` (a loaded target plus the drafters loaded against it): `frame` turns
     the request into tokens, the drafter registry builds the drafter, the one cost model
     (`edgespec.core.costs`) plans gamma auto and caps exact-mode drafts;
  3. fold the `StepEvent`s into a `Reply`: text, tokens and their sources, finish reason, the
     engine's counters, the two acceptance figures, predicted and measured speedup. `--json`
     prints `Reply.to_dict()`; the UI and the bench read the same fields.

A Session keeps its target's KV cache between requests: each generation decodes only what follows
the longest prefix of its prompt that the cache already holds (engine.py, "Prefix reuse"), so a
chat turn costs the new turn, not the whole conversation. `Conversation` keeps a multi-turn chat
for the terminal; the UI and the server send the whole conversation each turn and get the same
reuse. `Request.reuse_prefix=False` clears the cache first (bit-for-bit independent of earlier runs).
Reuse never crosses owners (`Request.owner`): a request of another owner than the one whose requests
filled the caches (the target's, and a kept draft model's) starts from empty ones, so neither the
counters (tokens reused) nor the prefill time tell one API key what another's prompts began with.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.core import drafters as registry
from edgespec.core.adaptive import AutoGamma
from edgespec.core.costs import GAMMA_MAX, CostModel, PassLog
from edgespec.core.drafters import Drafter
from edgespec.core.drafters.grammar import GrammarDrafter
from edgespec.core.drafters.prediction import PredictionDrafter
from edgespec.core.engine import (
    DEFAULT_MAX_TOKENS,
    VERIFIERS,
    Engine,
    FixedGamma,
    GammaPolicy,
    GenerationConfig,
    StepEvent,
)
from edgespec.core.grammar import Constraint
from edgespec.core.sampling import SamplingParams
from edgespec.core.stats import Stats
from edgespec.models.loader import RuntimeOptions, load_model
from edgespec.runtime import llama as runtime
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.grammar import grammar_tokenizer
from edgespec.runtime.llama import Model
from edgespec.service import tools as tooling

# How a prompt becomes tokens (`frame`):
#   chat        the model's own chat template from its GGUF metadata
#   transcript  "User: ... / Assistant: ..." lines, for base models asked to chat (stops at the next "User:")
#   qa          "Question: ...\nAnswer:", for base models asked a single question (the bench; stops at the
#               next "Question:")
#   raw         the text as is (completion)
#   auto        chat when the model has a template; else transcript for a conversation, raw for a text
#   question    chat when the model has a template, else qa: one answer to one prompt (the bench, distill)
FRAMINGS = ("auto", "question", "chat", "transcript", "qa", "raw")
DEFAULT_FRAMING = "auto"
QA_FRAME = "Question: {prompt}\nAnswer:"
# A base model goes on to write the next turn itself (Gemma-3-270M loops question and answer to the
# token limit): each framing ends the reply where its next turn would begin.
TRANSCRIPT_STOP = "\nUser:"
QA_STOP = "\nQuestion:"
# A request's drafter and draft length when it names none (Request; the command line and the UI
# start from these).
DEFAULT_DRAFT = "ngram"
# How often a generation's reply takes a fresh snapshot of the gamma policy (Reply.policy), besides
# its last event: every step cost ~0.3 ms on the 135M model's 14 ms passes (issue 44, item 39).
POLICY_EVERY_S = 0.25
DEFAULT_GAMMA = "auto"


def parse_gamma(value: str | int) -> GammaPolicy:
    """'auto' -> AutoGamma; a whole number 0..GAMMA_MAX -> FixedGamma."""
    text = str(value).strip().lower()
    if text == "auto":
        return AutoGamma()
    try:
        g = int(text)
    except ValueError:
        raise EdgeSpecError(f"gamma must be a whole number >= 0 or 'auto', got {value!r}") from None
    if g > GAMMA_MAX:
        raise EdgeSpecError(f"gamma {g} is more than a step can verify (at most {GAMMA_MAX}); try auto")
    return FixedGamma(g)


def parse_ngram(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in str(text).split(","))
    except ValueError:
        raise EdgeSpecError(f"--ngram wants MIN,MAX (e.g. 1,4), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise EdgeSpecError(f"n-gram sizes need 1 <= MIN <= MAX, got {lo},{hi}")
    return lo, hi


@dataclass
class Request:
    """One generation, as any consumer asks for it. Exactly one of `text`, `messages` and `tokens`."""

    text: str | None = None
    # The conversation, ending with the user's turn, tool results, or the start of the assistant's
    # answer, which the generation continues (as llama-server does with a last assistant message):
    # {"role", "content"}; an assistant turn may hold "tool_calls" (OpenAI's shape, arguments as a
    # JSON value), a "tool" turn "tool_call_id".
    messages: list[dict[str, Any]] | None = None
    tokens: list[int] | None = None  # a prompt already tokenized (llama-server's token-id prompts), fed as is
    system: str | None = None
    framing: str = DEFAULT_FRAMING
    draft: str = DEFAULT_DRAFT  # 'none' | a registered drafter name[:ARG] | a draft model name or path
    gamma: str = DEFAULT_GAMMA
    ngram: tuple[int, int] = registry.NGRAM_SIZES
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    verifier: str = VERIFIERS[0]
    stop: tuple[str, ...] = ()  # generation ends before any of these strings
    reuse_prefix: bool = True  # keep the cached prefix of the prompt (False: prefill all of it)
    # False: an end-of-generation token is just another token, and the framing's own end of a turn (a
    # base model's next "User:" line, Framed.stop) no stop either: llama-server's ignore_eos, which load
    # tests and benchmarks send to get max_tokens tokens; the request's own `stop` strings still end it
    stop_at_eog: bool = True
    # Whose request it is ('' = this machine's user; the server: a digest of the client's API key):
    # one owner's earlier answers never draft for another, and one owner's cached prompt is never
    # reused for another (Session).
    owner: str = ""
    # OpenAI function tools ({"type": "function", "function": {"name", "description", "parameters"}}),
    # shown to the model through its chat template (`tools.render`), and whether it may call them:
    # 'auto', 'none' (not shown), 'required' (a call of any of them) or {"type": "function",
    # "function": {"name": ...}} (a call of that one); the last two constrain the output (`grammar`).
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = tooling.AUTO
    # A constrained answer (tool_choice 'required' or named) may hold several calls. Off unless asked for:
    # the grammar lets the answer end after each call, but small models rank a newline above the end of
    # their turn there and call again, the same function with the same or other arguments, until
    # max_tokens (the bundled 135M and the real 1.5B both do).
    parallel_tool_calls: bool = False
    # An llguidance grammar (what llguidance.LLMatcher accepts) the output is held to; None: free text.
    # A request that must call a tool gets one for its call (`with_tool_grammar`).
    grammar: str | None = None  # llguidance grammar spec (service.structured); forced tokens are drafted free
    # The text the answer is expected to be (OpenAI's predicted outputs): drafted from first where
    # the answer follows it (`PredictionDrafter`).
    prediction: str | None = None
    # Each answer token's log-probability and this many alternatives (0-20; None: not asked), from the
    # target's rows (engine.token_logprobs): Reply.logprobs
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.text, self.messages, self.tokens)) != 1:
            raise EdgeSpecError("a request needs a prompt text, a conversation or prompt tokens (one of them)")
        if self.text is not None and not self.text.strip():
            raise EdgeSpecError("the prompt is empty")
        if self.tokens is not None:
            if not self.tokens:
                raise EdgeSpecError("the prompt is empty")
            if self.framing != "raw":
                raise EdgeSpecError("a prompt of token ids is fed as it is: it needs raw framing")
        if self.messages is not None:
            if not any(m.get("role") == "user" for m in self.messages):
                raise EdgeSpecError("a conversation needs a user message")
            last = self.messages[-1]
            if last.get("role") not in ("user", "tool", "assistant") or (
                    last.get("role") == "assistant" and not isinstance(last.get("content"), str)):
                raise EdgeSpecError("a conversation must end with the user's message, tool results, or the start "
                                    "of the assistant's answer to continue")
            if last.get("role") == "user" and not str(last.get("content", "")).strip():
                raise EdgeSpecError("the message is empty")
        tooling.check_choice(self.tools, self.tool_choice)
        if self.framing not in FRAMINGS:
            raise EdgeSpecError(f"framing must be one of {', '.join(FRAMINGS)}, got {self.framing!r}")
        if self.system and self.framing in ("qa", "raw"):
            raise EdgeSpecError(f"a system message needs chat framing; {self.framing} framing has no place for it")
        self.policy()  # a bad gamma fails here, as one line
        self.config()  # and bad engine settings (max tokens, verifier, stop strings)

    def policy(self) -> GammaPolicy:
        """A fresh gamma policy (no learning carried over from another generation)."""
        return parse_gamma(self.gamma)

    def call_names(self) -> tuple[str, ...]:
        """The functions whose calls the answer is read for: the tools shown to the model."""
        return tuple(t["function"]["name"] for t in tooling.shown_tools(self.tools, self.tool_choice) or ())

    def config(self, stop: tuple[str, ...] = ()) -> GenerationConfig:
        """The engine's settings for this request; `stop`: stop strings to add to the request's own
        (those of its framing, Framed.stop), unless the request generates past the end of its turn
        (stop_at_eog False)."""
        return GenerationConfig(max_tokens=self.max_tokens, sampling=self.sampling, verifier=self.verifier,
                                reuse_prefix=self.reuse_prefix, stop_at_eog=self.stop_at_eog,
                                stop_strings=self.stop + (stop if self.stop_at_eog else ()), logprobs=self.logprobs)


class _Halt:
    """The engine's stop signal: set by the caller's event (a stop button, a client gone) or by the
    session itself (`set`)."""

    def __init__(self, outer: threading.Event | None) -> None:
        self._outer, self._own = outer, threading.Event()

    def set(self) -> None:
        self._own.set()

    def asked(self) -> bool:
        """Whether the caller asked for the stop."""
        return self._outer is not None and self._outer.is_set()

    def is_set(self) -> bool:
        return self._own.is_set() or self.asked()


def with_tool_grammar(model: Model, req: Request) -> Request:
    """`req` with the grammar of a tool call when it must make one (tool_choice 'required' or a named
    function) and holds no grammar of its own: the call format `tools.render` shows the model, the
    arguments held to the function's schema."""
    if req.grammar is not None or not req.tools or not tooling.must_call(req.tool_choice):
        return req
    grammar = tooling.tool_call_grammar(req.tools, tooling.choice_name(req.tool_choice),
                                        parallel=req.parallel_tool_calls, tags_are_tokens=tooling.tags_are_tokens(model))
    return replace(req, grammar=grammar)


@dataclass
class Framed:
    tokens: list[int]
    framing: str  # what 'auto' resolved to
    stop: tuple[str, ...]  # stop strings the framing adds
    note: str | None = None  # something the user should know about how the prompt was fed


def check_in_vocab(model: Model, ids: Iterable[int], what: str = "") -> None:
    """An error naming the first of `ids` that is no token of the model's vocabulary (`what` leads it)."""
    bad = next((t for t in ids if not 0 <= t < model.n_vocab), None)
    if bad is not None:
        raise EdgeSpecError(f"{what}token id {bad} is not in {Path(model.path).name}'s vocabulary (0..{model.n_vocab - 1})")


def check_logit_bias(model: Model, sampling: SamplingParams) -> None:
    """A logit bias names tokens of the target's vocabulary."""
    check_in_vocab(model, (t for t, _ in sampling.logit_bias), "logit bias: ")


def frame(model: Model, req: Request) -> Framed:
    """The one place a request's text or conversation becomes the target's tokens. A conversation
    that ends with an assistant message is framed up to the assistant's turn, followed by that
    message's text as it is (no end of turn): the reply continues it."""
    if req.tokens is not None:
        check_in_vocab(model, req.tokens)
        return Framed(list(req.tokens), "raw", ())
    framing = req.framing
    has_template = model.chat_template() is not None
    note = None
    if framing == "auto":
        framing = "chat" if has_template else ("transcript" if req.messages is not None else "raw")
        if not has_template:  # a base model asked a question goes on with the text (question, answer, ...)
            base = f"{Path(model.path).name} is a base model (no chat template in its GGUF)"
            note = (f"{base}: it continues the text; for one answer to a question use --framing qa"
                    if framing == "raw" else f"{base}: the conversation is fed as a User:/Assistant: transcript")
    elif framing == "question":
        framing = "chat" if has_template else "qa"
    messages = req.messages if req.messages is not None else [{"role": "user", "content": req.text or ""}]
    started = ""  # the start of the answer to continue
    if messages[-1]["role"] == "assistant":
        started, messages = messages[-1]["content"], messages[:-1]
    if req.system and framing in ("qa", "raw"):
        raise EdgeSpecError(
            f"a system message needs chat or transcript framing; {Path(model.path).name} is fed {framing} text "
            "(add --framing transcript)"
        )
    if framing == "chat":
        if not has_template:
            raise EdgeSpecError(
                f"{Path(model.path).name} has no chat template in its metadata (a base model); "
                "use framing transcript, qa or raw"
            )
        msgs = ([{"role": "system", "content": req.system}] if req.system else []) + list(messages)
        # Only the template's own markers become control tokens: "<|im_end|>" inside a message is text,
        # or pasted text could end a turn and open a forged system turn.
        if req.tools or tooling.has_tool_turns(msgs):
            parts = tooling.render(model, msgs, tooling.shown_tools(req.tools, req.tool_choice))
        else:
            parts = model.chat_parts(msgs)
        if started:  # the answer so far: text of the reply, not of the template
            parts = [*parts, (started, False)]
        # A template that writes the BOS text itself must not get a second BOS from the tokenizer.
        info = model.info
        own_bos = info.add_bos and info.bos >= 0 and parts[0][0].startswith(model.token_text(info.bos))
        return Framed(model.tokenize_parts(parts, add_special=not own_bos), framing, ())
    if framing == "transcript":
        convo = ([{"role": "system", "content": req.system}] if req.system else []) + list(messages)
        if req.tools or tooling.has_tool_turns(convo):  # no template: tools, calls and results as text
            convo = tooling.polyfill(convo, tooling.shown_tools(req.tools, req.tool_choice), tooling.TEXT_ONLY)
        lines = []
        for m in convo:
            if m["role"] == "system":
                lines += [m["content"].strip(), ""]
            else:
                lines.append(f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content'].strip()}")
        text = "\n".join(lines) + "\nAssistant:" + (" " + started if started else "")
        return Framed(model.tokenize(text, add_special=True), framing, (TRANSCRIPT_STOP,), note)
    if req.messages is not None and len(req.messages) > 1:
        raise EdgeSpecError(f"{framing} framing takes one prompt, not a conversation; use chat or transcript")
    text = messages[-1]["content"]
    if framing == "qa":
        return Framed(model.tokenize(QA_FRAME.format(prompt=text), add_special=True), framing, (QA_STOP,))
    return Framed(model.tokenize(text, add_special=True), framing, (), note)


@dataclass
class Reply:
    """The fold of one generation's events: what every consumer shows and `--json` prints."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per token: 'draft' | 'target' | 'bonus'
    pieces: list[str] = field(default_factory=list)  # per token: the text it completed
    drafted_by: list[str] = field(default_factory=list)  # per token: drafter of a 'draft' token, else ''
    logprobs: list[dict] = field(default_factory=list)  # per token when Request.logprobs asked (StepEvent.logprobs)
    finish_reason: str | None = None  # 'eog' | 'length' | 'context' | 'stop' | 'stopped' | 'interrupted'
    stats: Stats = field(default_factory=Stats)
    framing: str = ""
    note: str | None = None  # how the prompt was fed, when the user should know (Framed.note)
    drafter: str = "none"
    gamma: str = "0"
    policy: dict = field(default_factory=dict)
    costs: CostModel | None = None
    target: str = ""
    device: str = ""  # where the target's layers ran ('cpu', 'Vulkan0', ...)
    device_layers: str = ""  # how many of them llama.cpp put there ("31/31"; "0" on the CPU)
    threads: int = 0  # CPU threads of the target's last pass (fewer than `threads_max` while other work holds cores)
    threads_max: int = 0

    def add(self, tokens: Sequence[int], sources: Sequence[str], pieces: Sequence[str], drafted_by: Sequence[str],
            stats: Stats, finish: str | None, logprobs: Sequence[dict | None] = ()) -> None:
        if any(lp is not None for lp in logprobs):
            self.logprobs.extend(logprobs)
        self.tokens.extend(tokens)
        self.sources.extend(sources)
        self.pieces.extend(pieces)
        self.drafted_by.extend(drafted_by)
        self.text += "".join(pieces)
        self.stats = stats
        if finish is not None:
            self.finish_reason = finish

    @classmethod
    def collect(cls, events: Iterator[StepEvent]) -> Reply:
        """Run a generation to the end and fold its events (engine-level use, tests)."""
        r = cls()
        for ev in events:
            r.add(ev.tokens, ev.sources, ev.pieces, ev.drafted_by, ev.stats, ev.finish_reason, ev.logprobs)
        return r

    # Speedups: both from the one cost model.
    @property
    def predicted_speedup(self) -> float | None:
        """What the paper's formula predicts for this run's draft lengths at its measured alpha."""
        if self.costs is None or not self.stats.target_calls:
            return None
        return self.costs.predicted_for(self.stats.drafted_hist, self.stats.alpha)

    @property
    def measured_speedup(self) -> float | None:
        """Tokens produced per second over the plain rate (produced: plain decoding needs the call
        that produces the end-of-generation token too). The plain rate is one token per mean plain
        step of this generation: the steps were timed under the same load as the rest, and a load
        that stalls some passes (a browser redrawing beside the app) stalls plain decoding as often,
        so their median would leave the stalls out of the plain rate only (in the web UI on 2 cores
        it read 0.76-0.81x where speculation ran at about plain decoding's speed; the mean read
        1.00-1.13x). A run that drafted nothing did plain decoding's work, so it is 1.00x: its timing
        against its own plain steps would only measure the machine's noise."""
        st = self.stats
        if self.costs is None or not st.target_calls:
            return None
        if not st.drafted:
            return 1.0
        t1 = float(np.mean(st.plain_pass_s)) if st.plain_pass_s else None
        return self.costs.measured_speedup(st.produced, st.target_calls, st.decode_s, t1)

    def to_dict(self) -> dict:
        be = runtime.backend_info()
        return finite({
            "text": self.text,
            "tokens": self.tokens,
            "token_sources": self.sources,
            "token_drafted_by": self.drafted_by,
            "finish_reason": self.finish_reason,
            "framing": self.framing,
            "note": self.note,
            "target": self.target,
            "draft": self.drafter,
            "gamma": self.gamma,
            "exact": be.mode == "exact",
            "backend": {**be.to_dict(), "device": self.device, "device_layers": self.device_layers,
                        "threads": self.threads, "threads_max": self.threads_max},
            "stats": self.stats.to_dict(),
            "speedup": {"predicted": self.predicted_speedup, "measured": self.measured_speedup},
            "draft_cap": None if self.costs is None else self.costs.draft_cap,
            "adaptive": self.policy,
        })


def finite(value: Any) -> Any:
    """`value` (dicts, lists and tuples of plain values) with every NaN or infinite float replaced by
    None: JSON has no NaN or Infinity, and clients (the OpenAI JS client, jq) reject them. Every
    JSON the programs print or serve passes through here."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, np.floating | np.integer):
        return finite(value.item())
    return value


class Conversation:
    """A multi-turn chat run turn by turn on one Session (the terminal's `--chat-file`): every turn
    is a Request for the whole conversation so far, built from `settings` (its text is ignored), and
    the Session's cache holds the previous turns, so only the new turn is prefilled."""

    def __init__(self, settings: Request, system: str | None = None) -> None:
        self.settings = settings
        self.system = system if system is not None else settings.system
        self.messages: list[dict[str, str]] = []

    def request(self, user: str) -> Request:
        """The Request for the next turn, the user saying `user`."""
        return replace(self.settings, text=None, system=self.system,
                       messages=[*self.messages, {"role": "user", "content": user}])

    def record(self, user: str, reply: Reply) -> None:
        """Keep a finished turn (the reply's text, as shown) in the conversation."""
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply.text}]

    def ask(self, session: Session, user: str, stop: threading.Event | None = None
            ) -> Iterator[tuple[StepEvent, Reply]]:
        """Run one turn on `session`, yielding like Session.generate; the turn is recorded when it ends."""
        reply = Reply()
        for ev, reply in session.generate(self.request(user), stop):
            yield ev, reply
        self.record(user, reply)

    def run(self, session: Session, user: str, stop: threading.Event | None = None) -> Reply:
        """One turn to the end; its Reply."""
        reply = Reply()
        for _, reply in self.ask(session, user, stop):  # noqa: B007 - the last fold is the reply
            pass
        return reply


class Session:
    """A loaded target and the drafters loaded against it; runs Requests one at a time."""

    def __init__(self, target: Model, opts: RuntimeOptions) -> None:
        self.target = target
        self.opts = opts
        self._kept: dict[str, Drafter] = {}  # drafters that load a model are kept between requests
        self._owner: str | None = None  # whose requests filled the caches (None: nobody's yet)
        self._passes = PassLog()  # the target passes generations timed: gamma auto plans with them too
        # Called with the fraction done while the target's cost profile is measured (its first use
        # with this set-up: seconds to minutes), so a consumer can say why nothing happens yet.
        self.on_profile: Callable[[float], None] | None = None

    @classmethod
    def load(cls, name: str, opts: RuntimeOptions, progress: Callable[[float], None] | None = None,
             download_progress: Callable[[int, int], None] | None = None) -> Session:
        return cls(load_model(name, opts, progress, download_progress), opts)

    def drafter(self, spec: str, ngram: tuple[int, int] = registry.NGRAM_SIZES, owner: str = "") -> Drafter | None:
        """The drafter `spec` names: built per request (for `owner`, Request.owner) when cheap, kept
        when it loads a model."""
        kind, arg = registry.split_spec(spec)
        if kind == "none":
            return None
        if registry.kinds()[kind].takes_model:
            key = f"{kind}:{arg}"
            if key not in self._kept:
                self._kept[key] = registry.build(spec, self.target, self.opts, ngram)
            return self._kept[key]
        return registry.build(spec, self.target, self.opts, ngram, owner)

    def _serve(self, owner: str) -> None:
        """Before a generation for `owner`: caches another owner's requests filled are emptied (the
        target's KV cache; a kept drafter's model, reloaded for this owner), so no prefix of theirs is
        reused for this one."""
        if owner == self._owner:
            return
        self.target.reset()
        for d in self._kept.values():
            d.close()
        self._kept.clear()
        self._owner = owner

    def cost_model(self, drafter: Drafter | None) -> CostModel | None:
        """The one cost model for this target and drafter (stored profile; measured on first use)."""
        if drafter is None:
            return None
        model = CostModel.for_target(self.target, drafter.draft_cost_s(), progress=self.on_profile)
        model.calibrate(self._passes)
        return model

    def prepare(self, req: Request) -> tuple[Framed, Engine]:
        """Tokens and an engine for `req` (loads a draft model and the cost profile if needed), so
        a consumer can do the slow part before its clock starts. A prediction drafts ahead of the
        request's drafter (or alone, with draft 'none'). A request with a grammar (its own, or a
        required tool call's) gets its constraint, and its drafter proposes the grammar's forced tokens
        too (drafters/grammar.py)."""
        req = with_tool_grammar(self.target, req)
        framed = frame(self.target, req)
        check_logit_bias(self.target, req.sampling)
        self._serve(req.owner)
        drafter = self.drafter(req.draft, req.ngram, req.owner)
        if req.prediction:
            drafter = PredictionDrafter(self.target.tokenize(req.prediction, add_special=False), drafter)
        costs = self.cost_model(drafter)
        if req.grammar is None:
            return framed, Engine(self.target, drafter, req.policy(), costs)
        grammar = Constraint(grammar_tokenizer(self.target), req.grammar)
        drafting = None if drafter is None else GrammarDrafter(grammar, drafter)
        return framed, Engine(self.target, drafting, req.policy(), costs, grammar)

    def generate(self, req: Request, stop: threading.Event | None = None,
                 prepared: tuple[Framed, Engine] | None = None) -> Iterator[tuple[StepEvent, Reply]]:
        """Run `req`; yield each engine event with the reply folded so far. The engine ends the
        generation at the request's and the framing's stop strings and holds back text that may
        begin one, so events and reply carry only what can be shown."""
        req = with_tool_grammar(self.target, req)
        framed, engine = prepared or self.prepare(req)
        reply = Reply(framing=framed.framing, note=framed.note, drafter=engine.drafter_name,
                      gamma=engine.policy.label, costs=engine.costs, target=self.target.path,
                      device=self.target.device, device_layers=self.target.layers_on_device)
        snapped = -math.inf
        # an answer that repeats one of its tool calls ends there (tools.ToolCallStream)
        names = req.call_names()
        calls = tooling.ToolCallStream(names) if names else None
        halt = _Halt(stop)
        try:
            for ev in engine.generate(framed.tokens, req.config(framed.stop), halt):
                reply.add(ev.tokens, ev.sources, ev.pieces, ev.drafted_by, ev.stats, ev.finish_reason, ev.logprobs)
                if calls is not None:
                    if ev.finish_reason is None:
                        calls.push("".join(ev.pieces))
                        if calls.repeated:
                            halt.set()
                    elif ev.finish_reason == "stopped" and calls.repeated and not halt.asked():
                        reply.finish_reason = "stop"  # ended by the answer, not by the caller
                reply.threads, reply.threads_max = self.target.threads_now, self.target.n_threads
                now = time.perf_counter()
                if engine.drafter is not None and (ev.finish_reason is not None or now - snapped >= POLICY_EVERY_S):
                    reply.policy, snapped = engine.policy.snapshot(), now
                yield ev, reply
        finally:
            if engine.drafter is not None:  # what it ended with, however it ended
                reply.policy = engine.policy.snapshot()
            drafter = engine.drafter
            if isinstance(drafter, GrammarDrafter):
                drafter = drafter.inner
            if isinstance(drafter, PredictionDrafter):  # the prediction holds nothing; what it wraps may be kept
                drafter = drafter.inner
            if drafter is not None and drafter not in self._kept.values():
                drafter.close()
        self._passes.add(reply.stats.pass_s)
        if engine.costs is not None:
            engine.costs.check_t1(self.target, reply.stats.plain_pass_s)

    def run(self, req: Request, stop: threading.Event | None = None) -> Reply:
        reply = Reply()
        for _, folded in self.generate(req, stop):
            reply = folded
        return reply

    def close(self) -> None:
        for d in self._kept.values():
            d.close()
        self._kept.clear()
        self.target.close()
