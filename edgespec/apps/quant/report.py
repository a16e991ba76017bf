"""What quantization costs in quality and gains in speed: `python -m edgespec.apps.quant report --reference REF.gguf
CANDIDATE.gguf ... --prompts FILE` prints a table and writes STEM.md, STEM.json and STEM.png.

Per candidate, against the reference (same vocabulary):
- size: file MB, true bits/weight (MX element bits + 8/32 for the scale; an emulated MX file counts
  its MX bits, not its F16 container) and file bits/weight;
- weights: relative RMSE ||W_c - W_r|| / ||W_r|| per tensor, and over all weights together;
- next-token distributions, teacher-forced over every position of the prompts: KL(p_ref || p_cand)
  in nats, top-1 agreement (= greedy acceptance of the candidate as draft for the reference), and
  alpha = mean sum_x min(p_ref, p_cand) at temperature 1 (the acceptance the candidate gets as
  draft under the lossless rejection sampler; Leviathan et al., Corollary 3.6);
- perplexity of a text (teacher-forced, one context);
- speed, interleaved in one run (round-robin over models, median of repeats, ratios vs the
  reference because absolute speed on a shared machine is noise): plain greedy decode tok/s;
  the candidate as target with the n-gram drafter (acceptance, tok/s); and the candidate as draft
  model for the reference in the engine (measured greedy acceptance, tok/s).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgespec.apps.quant.convert import FLOAT_TYPES, open_gguf, readable, tensor_float, type_bits
from edgespec.apps.quant.mx import FORMATS
from edgespec.core.drafters.model import ModelDrafter
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.engine import Engine, FixedGamma, GenerationConfig
from edgespec.core.sampling import log_softmax
from edgespec.core.stats import Stats, speedup
from edgespec.models.loader import check_threads
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import Model

LOGIT_CHUNK = 64  # rows of logits held at once: 64 x 262k floats = 64 MB for Gemma


@dataclass
class ModelSummary:
    """Size facts of one GGUF file."""

    label: str
    path: str
    file_mb: float
    n_params: int
    bits_per_weight: float  # true (MX bits for emulated MX tensors)
    file_bits_per_weight: float
    format: str
    emulated: bool
    tensor_types: dict[str, int]


def summarize_file(path: str | Path, label: str) -> ModelSummary:
    """Read a GGUF's tensor types and edgespec.quant metadata into a ModelSummary."""
    reader = open_gguf(path)
    fmt_field = reader.get_field("edgespec.quant.format")
    fmt = fmt_field.contents() if fmt_field is not None else ""
    emu_field = reader.get_field("edgespec.quant.emulated")
    emulated = bool(emu_field.contents()) if emu_field is not None else False
    counts: dict[str, int] = {}
    n_params, bits = 0, 0.0
    for t in reader.tensors:
        n = int(t.n_elements)
        n_params += n
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        # An emulated MX file keeps MX values in F16/BF16/F32 matrices; 1-D tensors stay F32.
        if emulated and fmt in FORMATS and len(t.shape) >= 2 and t.tensor_type in FLOAT_TYPES:
            bits += n * FORMATS[fmt].bits_per_weight
        else:
            bits += n * type_bits(t.tensor_type)
    if not fmt:
        top = max((k for k in counts if k != "F32"), key=lambda k: counts[k], default="F32")
        fmt = f"mostly {top}"
    size = Path(path).stat().st_size
    return ModelSummary(label, str(path), size / 1e6, n_params, bits / n_params, size * 8 / n_params,
                        fmt, emulated, counts)


def tensor_rmse(ref_path: str | Path, cand_paths: Sequence[str | Path],
                names: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Relative RMSE ||c - r|| / ||r|| per tensor present in the reference and a candidate, one dict
    per candidate, each with '__all__' over all those weights together. Each reference tensor is
    dequantized once for all candidates; `names` limits the tensors compared."""
    ref = open_gguf(ref_path)
    cands = [{t.name: t for t in open_gguf(c).tensors} for c in cand_paths]
    out: list[dict[str, float]] = [{} for _ in cands]
    err = np.zeros(len(cands))
    total = 0.0
    for t in ref.tensors:
        if (names is not None and t.name not in names) or not readable(t.tensor_type):
            continue
        r = tensor_float(t).reshape(-1)
        r2 = float(np.dot(r, r))
        total += r2
        for i, (ct, path) in enumerate(zip(cands, cand_paths, strict=True)):
            c = ct.get(t.name)
            if c is None or not readable(c.tensor_type):
                continue
            d = tensor_float(c).reshape(-1)
            if d.shape != r.shape:
                raise EdgeSpecError(f"tensor {t.name} has {r.size} values in the reference but {d.size} in {path}")
            diff = d - r
            e2 = float(np.dot(diff, diff))
            out[i][t.name] = math.sqrt(e2 / r2) if r2 > 0 else 0.0
            err[i] += e2
    for i in range(len(cands)):
        out[i]["__all__"] = math.sqrt(err[i] / total) if total > 0 else 0.0
    return out


def matrix_rmse_summary(per: dict[str, float], matrices: set[str]) -> tuple[float, str, float]:
    """Median, worst tensor and its value of per-tensor relative RMSE over the 2-D tensors (1-D norms
    are copied unchanged and would pull the median to 0)."""
    vals = sorted((v, n) for n, v in per.items() if n in matrices)
    if not vals:
        return 0.0, "", 0.0
    return float(statistics.median(v for v, _ in vals)), vals[-1][1], vals[-1][0]


@dataclass
class DistributionStats:
    positions: int = 0
    kl_sum: float = 0.0
    top1_sum: int = 0
    alpha_sum: float = 0.0

    def add(self, ref_logits: np.ndarray, cand_logits: np.ndarray) -> None:
        """Accumulate over rows of [n, V] logits at the same positions."""
        lp, lq = log_softmax(ref_logits), log_softmax(cand_logits)
        p, q = np.exp(lp), np.exp(lq)
        self.kl_sum += float((p * (lp - lq)).sum())
        self.top1_sum += int((ref_logits.argmax(axis=1) == cand_logits.argmax(axis=1)).sum())
        self.alpha_sum += float(np.minimum(p, q).sum())  # sum over rows of alpha = sum_x min(p, q)
        self.positions += len(lp)

    @property
    def kl(self) -> float:
        return self.kl_sum / max(self.positions, 1)

    @property
    def top1(self) -> float:
        return self.top1_sum / max(self.positions, 1)

    @property
    def alpha(self) -> float:
        return self.alpha_sum / max(self.positions, 1)


def compare_distributions(ref: Model, cand: Model, prompts: Sequence[Sequence[int]]) -> DistributionStats:
    """Teacher-forced next-token statistics of cand vs ref over every position of every prompt."""
    if ref.n_vocab != cand.n_vocab:
        raise EdgeSpecError(f"vocabularies differ: reference has {ref.n_vocab} tokens, candidate {cand.n_vocab}")
    stats = DistributionStats()
    for toks in prompts:
        ref.reset()
        cand.reset()
        for start in range(0, len(toks), LOGIT_CHUNK):
            chunk = list(toks[start : start + LOGIT_CHUNK])
            r = np.array(ref.decode(chunk, n_logits=len(chunk)))  # copy: the view dies at the next decode
            c = cand.decode(chunk, n_logits=len(chunk))
            stats.add(r, c)
    return stats


def perplexity(model: Model, tokens: Sequence[int]) -> float:
    """exp(mean NLL) of tokens[1:] given their prefixes, in one context (teacher-forced)."""
    model.reset()
    nll, n = 0.0, 0
    for start in range(0, len(tokens) - 1, LOGIT_CHUNK):
        chunk = list(tokens[start : start + LOGIT_CHUNK])
        nxt = np.asarray(tokens[start + 1 : start + 1 + len(chunk)])
        logits = model.decode(chunk, n_logits=len(chunk))[: len(nxt)]
        lp = log_softmax(logits)
        nll -= float(lp[np.arange(len(nxt)), nxt].sum())
        n += len(nxt)
    return float(np.exp(nll / max(n, 1)))


def run_generation(target: Model, drafter, prompts: Sequence[Sequence[int]], gen_tokens: int, gamma: int) -> Stats:
    """Greedy generation of gen_tokens per prompt; the prompts' Stats pooled (`Stats.merge`: its
    tokens/s counts decode time only, its acceptance is over all drafts)."""
    engine = Engine(target, drafter, FixedGamma(gamma if drafter is not None else 0))
    cfg = GenerationConfig(max_tokens=gen_tokens, stop_at_eog=False)
    runs = []
    for toks in prompts:
        *_, last = engine.generate(list(toks), cfg)
        runs.append(last.stats)
    return Stats.merge(runs)


@dataclass
class CandidateReport:
    summary: ModelSummary
    rel_rmse_all: float = 0.0
    rel_rmse_median: float = 0.0
    rel_rmse_max: float = 0.0
    rel_rmse_max_tensor: str = ""
    kl: float = 0.0
    top1: float = 0.0
    alpha: float = 0.0
    positions: int = 0
    perplexity: float = 0.0
    decode_tps: float = 0.0
    decode_ratio: float = 0.0
    ngram_acceptance: float = 0.0
    ngram_tps: float = 0.0
    ngram_ratio: float = 0.0  # n-gram speculative tok/s of this model over the reference's plain tok/s
    draft_acceptance: float = 0.0  # engine, greedy: this model drafting for the reference
    draft_tps: float = 0.0
    draft_ratio: float = 0.0
    per_tensor_rmse: dict[str, float] = field(default_factory=dict)


def read_prompts(path: str | Path) -> list[str]:
    """Prompts separated by lines holding only `---` (a file without such lines is one prompt)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise EdgeSpecError(f"prompts file not found: {p}")
    text = p.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    prompts = [b.strip() for b in re.split(r"(?m)^---[ \t]*$", text) if b.strip()]
    if not prompts:
        raise EdgeSpecError(f"no prompts in {p} (separate prompts with lines holding only ---)")
    return prompts


def build_report(
    reference: str | Path,
    candidates: Sequence[str | Path],
    prompts: Sequence[str],
    text: str,
    *,
    labels: Sequence[str] | None = None,
    max_prompt_tokens: int = 256,
    ppl_tokens: int = 1024,
    gen_tokens: int = 64,
    repeats: int = 3,
    gamma: int = 3,
    speed_prompts: int = 2,
    n_threads: int | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    show_progress: bool = True,
) -> dict:
    """Measure everything in the module docstring; returns the JSON-ready report."""
    labels = list(labels) if labels else [Path(c).stem for c in candidates]
    if len(labels) != len(candidates):
        raise EdgeSpecError(f"{len(labels)} labels for {len(candidates)} candidates")
    n_ctx = max(max_prompt_tokens + gen_tokens + 16, ppl_tokens + 16)
    open_gguf(reference)
    reps = [CandidateReport(summarize_file(c, lab)) for c, lab in zip(candidates, labels, strict=True)]

    log("weights: relative RMSE per tensor")
    _weights(reference, candidates, reps)

    def load(path: str | Path) -> Model:
        return Model(path, n_ctx=n_ctx, n_threads=n_threads, flash_attn="off")

    ref = load(reference)
    prompt_toks = [ref.tokenize(p)[:max_prompt_tokens] for p in prompts]
    text_toks = ref.tokenize(text)[:ppl_tokens]
    if len(text_toks) < 2:
        raise EdgeSpecError("the perplexity text is shorter than two tokens")
    models = [load(c) for c in candidates]

    log("distributions: KL, top-1 agreement, alpha, perplexity")
    ref_ppl = _distributions(ref, models, reps, prompt_toks, text_toks, show_progress)

    sp = prompt_toks[:speed_prompts]
    log(f"speed: {repeats} interleaved rounds of {gen_tokens} tokens x {len(sp)} prompts")
    ref_tps = _speed(ref, models, reps, sp, gen_tokens, repeats, gamma, show_progress)
    for m in [ref, *models]:
        m.close()

    ref_summary = summarize_file(reference, Path(reference).stem)
    return {
        "reference": asdict(ref_summary) | {"perplexity": ref_ppl, "decode_tps": ref_tps},
        "candidates": [asdict(r) for r in reps],
        "settings": {
            "prompts": len(prompt_toks),
            "positions": reps[0].positions if reps else 0,
            "max_prompt_tokens": max_prompt_tokens,
            "ppl_tokens": len(text_toks),
            "gen_tokens": gen_tokens,
            "speed_prompts": len(sp),
            "repeats": repeats,
            "gamma": gamma,
            "threads": ref.n_threads,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        },
    }


def _weights(reference: str | Path, candidates: Sequence[str | Path], reps: list[CandidateReport]) -> None:
    """Each candidate's relative RMSE against the reference: over all weights, the median and worst
    of its matrices, and per tensor."""
    matrices = {t.name for t in open_gguf(reference).tensors if len(t.shape) >= 2}
    for rep, per in zip(reps, tensor_rmse(reference, candidates), strict=True):
        rep.rel_rmse_all = per.pop("__all__")
        rep.rel_rmse_median, rep.rel_rmse_max_tensor, rep.rel_rmse_max = matrix_rmse_summary(per, matrices)
        rep.per_tensor_rmse = dict(per)


def _distributions(ref: Model, models: Sequence[Model], reps: list[CandidateReport], prompt_toks: list[list[int]],
                   text_toks: list[int], show_progress: bool) -> float:
    """Each candidate's next-token statistics against the reference and its perplexity; returns
    the reference's perplexity."""
    ref_ppl = perplexity(ref, text_toks)
    for rep, m in zip(tqdm(reps, desc="logits", disable=not show_progress, leave=False), models, strict=True):
        st = compare_distributions(ref, m, prompt_toks)
        rep.kl, rep.top1, rep.alpha, rep.positions = st.kl, st.top1, st.alpha, st.positions
        rep.perplexity = perplexity(m, text_toks)
    return ref_ppl


def _speed(ref: Model, models: Sequence[Model], reps: list[CandidateReport], sp: list[list[int]], gen_tokens: int,
           repeats: int, gamma: int, show_progress: bool) -> float:
    """Each candidate's speeds over the reference's plain decoding, in interleaved rounds: plain,
    as target with the n-gram drafter, as draft model for the reference (median tok/s of the
    rounds; acceptance pooled over them). Returns the reference's plain tok/s."""
    drafters = [ModelDrafter(m, ref) for m in models]
    runs: dict[str, list[list[Stats]]] = {"ref": [[]], "plain": [[] for _ in models],
                                          "ngram": [[] for _ in models], "draft": [[] for _ in models]}
    bar = tqdm(total=repeats * (1 + 3 * len(models)), desc="speed", disable=not show_progress, leave=False)
    for _ in range(repeats):
        runs["ref"][0].append(run_generation(ref, None, sp, gen_tokens, 0))
        bar.update()
        for i, m in enumerate(models):
            runs["plain"][i].append(run_generation(m, None, sp, gen_tokens, 0))
            runs["ngram"][i].append(run_generation(m, NgramDrafter(), sp, gen_tokens, gamma))
            runs["draft"][i].append(run_generation(ref, drafters[i], sp, gen_tokens, gamma))
            bar.update(3)
    bar.close()

    def med(rounds: list[Stats]) -> float:
        return float(statistics.median(st.tokens_per_s for st in rounds))

    ref_tps = med(runs["ref"][0])
    for i, rep in enumerate(reps):
        rep.decode_tps = med(runs["plain"][i])
        rep.decode_ratio = speedup(rep.decode_tps, ref_tps)
        rep.ngram_tps = med(runs["ngram"][i])
        rep.ngram_ratio = speedup(rep.ngram_tps, ref_tps)
        rep.ngram_acceptance = Stats.merge(runs["ngram"][i]).acceptance_rate
        rep.draft_tps = med(runs["draft"][i])
        rep.draft_ratio = speedup(rep.draft_tps, ref_tps)
        rep.draft_acceptance = Stats.merge(runs["draft"][i]).acceptance_rate
    return ref_tps


def to_markdown(report: dict, title: str | None = None) -> str:
    """The report as a Markdown table plus a short legend."""
    ref = report["reference"]
    s = report["settings"]
    lines = [
        f"## {title or 'Quantization report: ' + ref['label']}",
        "",
        f"Reference: `{Path(ref['path']).name}` ({ref['format']}, {ref['file_mb']:.1f} MB, "
        f"{ref['bits_per_weight']:.2f} bits/weight), perplexity {ref['perplexity']:.3f}, "
        f"plain decode {ref['decode_tps']:.1f} tok/s (the 1.00x of the speed columns).",
        "",
        "| model | format | MB | bits/w true (file) | rel. RMSE all / median / max tensor | KL nats | top-1 agree | "
        "alpha as draft | PPL | decode x ref | n-gram acc. | n-gram x ref | as draft: acc. | as draft x ref |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["candidates"]:
        sm = c["summary"]
        fmt = sm["format"] + (" (emulated)" if sm["emulated"] else "")
        lines.append(
            f"| {sm['label']} | {fmt} | {sm['file_mb']:.1f} | {sm['bits_per_weight']:.2f} ({sm['file_bits_per_weight']:.2f}) | "
            f"{c['rel_rmse_all']:.4f} / {c['rel_rmse_median']:.4f} / {c['rel_rmse_max']:.4f} | {c['kl']:.4f} | "
            f"{c['top1']:.3f} | {c['alpha']:.3f} | "
            f"{c['perplexity']:.3f} | {c['decode_ratio']:.2f}x | {c['ngram_acceptance']:.2f} | {c['ngram_ratio']:.2f}x | "
            f"{c['draft_acceptance']:.2f} | {c['draft_ratio']:.2f}x |"
        )
    lines += [
        "",
        f"{s['prompts']} prompts, {s['positions']} teacher-forced positions; perplexity over {s['ppl_tokens']} tokens; "
        f"speed: {s['repeats']} interleaved rounds x {s['speed_prompts']} prompts x {s['gen_tokens']} greedy tokens, "
        f"median tok/s, {s['threads']} threads, gamma {s['gamma']} for n-gram and draft-model runs; {s['date_utc']} UTC.",
        "",
        "- *rel. RMSE*: ||W_model - W_ref|| / ||W_ref|| over all weights together (dominated by the largest-norm "
        "tensors), the median over the 2-D tensors, and the worst tensor.",
        "- *bits/w true*: MX element bits + 8/32 for the shared E8M0 scale on MX tensors (an emulated file "
        "counts its MX bits, not its F16 container); *file*: file size x 8 / weights.",
        "- *KL*: mean KL(p_ref || p_model) of next-token distributions; *top-1 agree* = greedy acceptance "
        "of the model drafting for the reference; *alpha* = mean sum_x min(p_ref, p_model) at T=1, its "
        "acceptance under the lossless rejection sampler.",
        "- *decode x ref*: plain greedy tok/s over the reference's; *n-gram*: the model as target with the "
        "prompt-lookup drafter; *as draft*: the reference as target with this model as draft model "
        "(acceptance measured by the engine, greedy).",
    ]
    return "\n".join(lines) + "\n"


def _draw(report: dict, a1, a2) -> None:
    """KL vs true bits/weight on a1; speed ratios per model on a2."""
    cands = report["candidates"]
    names = [c["summary"]["label"] for c in cands]
    for c, n in zip(cands, names, strict=True):
        kl = c["kl"]
        if kl <= 0:
            continue  # the reference itself (KL 0) has no place on a log axis
        a1.scatter(c["summary"]["bits_per_weight"], kl)
        a1.annotate(n, (c["summary"]["bits_per_weight"], kl), fontsize=7, xytext=(3, 3), textcoords="offset points")
    a1.set_yscale("log")
    a1.set_xlabel("bits per weight (true)")
    a1.set_ylabel("KL vs reference (nats, log)")
    a1.set_title(report["reference"]["label"], fontsize=8)
    a1.grid(alpha=0.3)
    x = np.arange(len(cands))
    w = 0.27
    a2.bar(x - w, [c["decode_ratio"] for c in cands], w, label="plain decode")
    a2.bar(x, [c["ngram_ratio"] for c in cands], w, label="+ n-gram speculation")
    a2.bar(x + w, [c["draft_ratio"] for c in cands], w, label="as draft for reference")
    a2.axhline(1.0, color="k", lw=0.8)
    a2.set_xticks(x, names, rotation=35, ha="right", fontsize=7)
    a2.set_ylabel("tok/s vs reference plain decode")
    a2.legend(fontsize=7)
    a2.grid(alpha=0.3, axis="y")


def plot(reports: dict | Sequence[dict], path: str | Path, titles: Sequence[str] | None = None) -> None:
    """One row of two panels per report: KL vs true bits/weight, and speed ratios per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [reports] if isinstance(reports, dict) else list(reports)
    fig, axes = plt.subplots(len(reports), 2, figsize=(10, 3.8 * len(reports)), dpi=80, squeeze=False)
    for i, rep in enumerate(reports):
        _draw(rep, *axes[i])
        if titles:
            axes[i][0].set_title(titles[i], fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def check_output_folder(stem: str | Path) -> None:
    """Raise a one-line error unless STEM's folder exists and takes new files (checked before measuring)."""
    folder = Path(stem).expanduser().parent
    if not folder.is_dir():
        raise EdgeSpecError(f"output folder does not exist: {folder}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise EdgeSpecError(f"cannot write the report in {folder} ({exc.strerror or exc}); choose a writable folder") from None


def write_outputs(report: dict, stem: str | Path, title: str | None = None) -> tuple[Path, Path, Path]:
    """Write STEM.md, STEM.json and STEM.png; returns their paths."""
    check_output_folder(stem)
    stem = Path(stem).expanduser()
    md, js, png = stem.with_suffix(".md"), stem.with_suffix(".json"), stem.with_suffix(".png")
    try:
        md.write_text(to_markdown(report, title), encoding="utf-8")
        js.write_text(json.dumps(report, indent=1), encoding="utf-8")
        plot(report, png, [title] if title else None)
    except OSError as exc:
        raise EdgeSpecError(f"could not write the report {stem}.*: {exc.strerror or exc}") from None
    return md, js, png


def main_report(args: argparse.Namespace) -> None:
    """`python -m edgespec.apps.quant report` (arguments from edgespec.apps.quant.__main__)."""
    prompts = read_prompts(args.prompts)
    if args.text:
        tp = Path(args.text).expanduser()
        if not tp.is_file():
            raise EdgeSpecError(f"text file not found: {tp}")
        text = tp.read_text(encoding="utf-8", errors="replace")
    else:
        text = "\n\n".join(prompts)
    for n, v, least in (("--repeats", args.repeats, 1), ("--gen-tokens", args.gen_tokens, 1),
                        ("--max-prompt-tokens", args.max_prompt_tokens, 1), ("--gamma", args.gamma, 1),
                        ("--ppl-tokens", args.ppl_tokens, 2)):  # perplexity scores each token after the first
        if v < least:
            raise EdgeSpecError(f"{n} must be >= {least}, got {v}")
    check_threads(args.threads, "--threads")
    for path in (args.reference, *args.candidates):
        open_gguf(path)  # damaged files (a layer count llama.cpp would abort on) before minutes of work
    check_output_folder(args.out)
    report = build_report(
        args.reference, args.candidates, prompts, text,
        labels=args.labels.split(",") if args.labels else None,
        max_prompt_tokens=args.max_prompt_tokens, ppl_tokens=args.ppl_tokens, gen_tokens=args.gen_tokens,
        repeats=args.repeats, gamma=args.gamma, n_threads=args.threads,
    )
    md, js, png = write_outputs(report, args.out, args.title)
    print(to_markdown(report, args.title))
    print(f"wrote {md}, {js}, {png}", file=sys.stderr)

