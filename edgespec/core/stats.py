"""`Stats`: the counters and timings of one generation (or, merged, of several), and the figures
derived from them. The engine records into it step by step; every consumer (UI, CLI, server, bench)
reads its properties, none recomputes them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np

PLAIN_KEEP = 256  # plain-step timings kept per generation (Stats.plain_pass_s)


@dataclass
class Stats:
    """Counters and timings of one generation, or of several pooled by `merge`; every consumer
    reads these and the properties derived from them, none recomputes them."""

    prompt_tokens: int = 0
    prompt_reused: int = 0  # prompt tokens whose K/V were already in the cache (prefix reuse)
    prompt_prefilled: int = 0  # prompt tokens decoded by this generation (prompt_tokens - prompt_reused)
    generated: int = 0  # tokens of the answer (the reply's tokens; what tokens/s counts)
    # Tokens that ended the generation without being part of the answer: the end-of-generation
    # token, or the tokens of a stop string (after the one its first character falls in). They were
    # produced by target calls all the same (see `produced`).
    end_tokens: int = 0
    target_calls: int = 0
    # Drafts are counted up to the generation's end: drafts a step verified beyond the token that
    # ended the generation (an end-of-generation token, the end of a stop string) are not.
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # steps whose draft was cut short by a rejected token (before the end)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    grammar_s: float = 0.0  # of draft_s and verify_s: the grammar's masks and forced tokens (core/grammar.py)
    wall_s: float = 0.0
    ttft_s: float | None = None
    target_bytes: int = 0
    drafted_hist: dict[int, int] = field(default_factory=dict)
    accepted_hist: dict[int, int] = field(default_factory=dict)
    # Wall seconds of each plain (single-row) step, from the previous event to this one, i.e. what
    # plain decoding costs per token here and now: for the measured speedup and for judging the
    # stored cost profile. The last PLAIN_KEEP of them.
    plain_pass_s: list[float] = field(default_factory=list)
    # Seconds of each target pass (llama_decode and nothing else) by its row count, i.e. T(K) as
    # real steps see it, at the real context length: what the cost profile is checked against.
    pass_s: dict[int, list[float]] = field(default_factory=dict)
    # Per draft depth d (index d-1): drafts at depth d that were tested (proposed, every earlier
    # draft of the step accepted, before the generation's end) and how many of those were accepted.
    depth_tested: list[int] = field(default_factory=list)
    depth_accepted: list[int] = field(default_factory=list)
    # drafted and accepted, counted as above, by the source that proposed the draft (Draft.source, else
    # the drafter's name): 'ngram', 'learned', the suffix drafter's 'context' and 'answers', ...
    source_drafted: dict[str, int] = field(default_factory=dict)
    source_accepted: dict[str, int] = field(default_factory=dict)

    @classmethod
    def merge(cls, stats: Iterable[Stats]) -> Stats:
        """Several generations pooled: counters, timings and histograms summed, timings per pass
        joined, so every property is the pooled figure (tokens_per_s = all tokens over all decode
        seconds, alpha = all accepted over all tested, ...). ttft_s is the mean of those known;
        target_bytes the largest (one target). merge([s]) is a copy of s."""
        stats = list(stats)
        out = cls()
        for name in _SUMMED:
            setattr(out, name, sum(getattr(s, name) for s in stats))
        ttft = [s.ttft_s for s in stats if s.ttft_s is not None]
        out.ttft_s = sum(ttft) / len(ttft) if ttft else None
        out.target_bytes = max((s.target_bytes for s in stats), default=0)
        for s in stats:
            for k, n in s.drafted_hist.items():
                out.drafted_hist[k] = out.drafted_hist.get(k, 0) + n
            for k, n in s.accepted_hist.items():
                out.accepted_hist[k] = out.accepted_hist.get(k, 0) + n
            out.plain_pass_s += s.plain_pass_s
            for k, v in s.pass_s.items():
                out.pass_s.setdefault(k, []).extend(v)
            for d, (t, a) in enumerate(zip(s.depth_tested, s.depth_accepted, strict=True)):
                out._add_depth(d, t, a)
            for src in s.source_drafted:
                out._add_source(src, s.source_drafted[src], s.source_accepted.get(src, 0))
        return out

    def copy(self) -> Stats:
        """A copy that shares no list or dict with this one (a snapshot of a generation going on)."""
        return Stats.merge([self])

    @classmethod
    def from_dict(cls, d: dict) -> Stats:
        """The Stats `to_dict` wrote (results files): every counter, timing and histogram; the
        timings per pass are not in it (to_dict keeps their medians), so they stay empty."""
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name not in ("plain_pass_s", "pass_s")}
        for name in ("drafted_hist", "accepted_hist"):
            if name in kw:
                kw[name] = {int(k): int(n) for k, n in kw[name].items()}
        for name in ("depth_tested", "depth_accepted"):
            if name in kw:
                kw[name] = [int(n) for n in kw[name]]
        for name in ("source_drafted", "source_accepted"):
            if name in kw:
                kw[name] = {str(k): int(n) for k, n in kw[name].items()}
        return cls(**kw)

    @property
    def decode_s(self) -> float:
        """Seconds spent producing tokens (wall time after the prompt was processed)."""
        return max(self.wall_s - self.prefill_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.decode_s

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted: the share of proposed tokens that were kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """The paper's alpha, per token tested: accepted / (accepted + rejections). Drafts after the
        first rejection of a step are never tested, so this is >= acceptance_rate."""
        tested = self.accepted + self.rejections
        return self.accepted / tested if tested else 0.0

    @property
    def alpha_by_depth(self) -> list[float | None]:
        """alpha per draft depth: entry d-1 is accepted / tested of the drafts at depth d (None
        where none was tested). The paper's alpha assumes these equal; a copy from the context
        is likelier right once its first tokens were, so its later depths are higher."""
        return [a / t if t else None for t, a in zip(self.depth_tested, self.depth_accepted, strict=True)]

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per target call."""
        return self.accepted / self.target_calls if self.target_calls else 0.0

    @property
    def produced(self) -> int:
        """Tokens the target calls produced up to the generation's end: the answer's and the ones
        that ended it. Every call produces at least one."""
        return self.generated + self.end_tokens

    @property
    def tokens_per_call(self) -> float:
        """Tokens produced per target call (`produced`: the token that ended the generation counts,
        as the call that produced it was needed): 1.00 for plain decoding, more when drafts are kept."""
        return self.produced / self.target_calls if self.target_calls else 0.0

    @property
    def bandwidth_gb_s(self) -> float:
        """Target weight bytes streamed per second (each target call reads all weights once)."""
        return self.target_bytes * self.target_calls / self.decode_s / 1e9

    def record_step(self, k: int, n_acc: int, answer: int, end: int | None = None,
                    source: str | Sequence[str] = "") -> None:
        """Count one target call that verified k draft tokens, proposed by `source` (or per token,
        when the draft mixes sources: a grammar's forced tokens and a drafter's), and accepted
        n_acc, adding `answer` tokens to the answer. `end`: the generation ended at the step's
        end-th token (None: it goes on); the step's tokens up to there that are not the answer's
        ended it (an end-of-generation token, a stop string). A stop string may begin in tokens
        earlier steps counted as answer, so `answer` can be below zero."""
        drafted, accepted, rejected = _step_counts(k, n_acc, end)
        if isinstance(source, str):
            if drafted:
                self._add_source(source, drafted, accepted)
        else:
            for j, src in enumerate(source[:drafted]):
                self._add_source(src, 1, int(j < accepted))
        self.target_calls += 1
        self.generated += answer
        if end is not None:
            self.end_tokens += end - answer
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += rejected
        self._count_depths(accepted, rejected)
        self.drafted_hist[k] = self.drafted_hist.get(k, 0) + 1  # passes by draft length: what they cost
        if drafted:
            self.accepted_hist[accepted] = self.accepted_hist.get(accepted, 0) + 1

    def record_plain_pass(self, seconds: float) -> None:
        """One plain (single-row) step took `seconds`; keeps the last PLAIN_KEEP of them."""
        self.plain_pass_s.append(seconds)
        del self.plain_pass_s[:-PLAIN_KEEP]

    def _count_depths(self, accepted: int, rejected: int) -> None:
        """Count one step's drafts by depth: depths 1..accepted were tested and accepted, depth
        accepted+1 tested and rejected when the step had a rejection."""
        for d in range(accepted + rejected):
            self._add_depth(d, 1, int(d < accepted))

    def _add_source(self, source: str, drafted: int, accepted: int) -> None:
        self.source_drafted[source] = self.source_drafted.get(source, 0) + drafted
        self.source_accepted[source] = self.source_accepted.get(source, 0) + accepted

    def _add_depth(self, d: int, tested: int, accepted: int) -> None:
        """Add to the counts of depth d+1 (index d), growing the lists as needed."""
        while len(self.depth_tested) <= d:
            self.depth_tested.append(0)
            self.depth_accepted.append(0)
        self.depth_tested[d] += tested
        self.depth_accepted[d] += accepted

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["plain_pass_s"], d["pass_s"]
        d["pass_s_median"] = {str(k): float(np.median(v)) for k, v in sorted(self.pass_s.items())}
        d["pass_count"] = {str(k): len(v) for k, v in sorted(self.pass_s.items())}
        d.update(produced=self.produced, tokens_per_s=self.tokens_per_s, acceptance_rate=self.acceptance_rate,
                 alpha=self.alpha, alpha_by_depth=self.alpha_by_depth,
                 mean_accepted=self.mean_accepted, tokens_per_call=self.tokens_per_call,
                 bandwidth_gb_s=self.bandwidth_gb_s)
        d["drafted_hist"] = {str(k): v for k, v in sorted(self.drafted_hist.items())}
        d["accepted_hist"] = {str(k): v for k, v in sorted(self.accepted_hist.items())}
        return d


# Counters and timings `merge` sums.
_SUMMED = ("prompt_tokens", "prompt_reused", "prompt_prefilled", "generated", "end_tokens", "target_calls",
           "drafted", "accepted", "rejections", "prefill_s", "draft_s", "target_s", "verify_s", "grammar_s", "wall_s")


def _step_counts(k: int, n_acc: int, end: int | None) -> tuple[int, int, int]:
    """(drafted, accepted, rejections) of a step that verified k drafts and accepted n_acc. `end`:
    the generation ended at the step's end-th token (None: it goes on). Draft j (1-based) sits at
    position j, so drafts beyond the end are neither drafted nor accepted, and a rejection counts
    only if the rejected draft came before the end."""
    if end is None:
        return k, n_acc, int(n_acc < k)
    drafted, accepted = min(k, end), min(n_acc, end)
    return drafted, accepted, int(accepted < drafted)


def tested_drafts(k: int, n_acc: int, end: int | None = None) -> int:
    """Drafts a step tested, the evidence alpha is measured on (`Stats.alpha`: accepted + rejections):
    the accepted ones and the first rejected one, drafts after it never being tested; counted as
    `record_step` counts them (`end` as for `_step_counts`)."""
    _, accepted, rejected = _step_counts(k, n_acc, end)
    return accepted + rejected


def speedup(rate: float, baseline: float) -> float:
    """How many times faster `rate` (tokens/s) is than `baseline` (tokens/s): the one speedup of
    two measured rates (bench rows and cells, the race, the quantization report); 0.0 when there
    is no baseline rate to compare with."""
    return rate / baseline if baseline else 0.0
