"""`python app.py distill`'s command: the flags, the run from collection to export within the
budget, and its summary in words."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np

from edgespec.apps.distill import corpus
from edgespec.apps.distill.collect import Record, collect, collection_rates, split_prompts
from edgespec.apps.distill.config import DEFAULT_SUITE, DistillConfig
from edgespec.apps.distill.onnx_export import check_out, export
from edgespec.apps.distill.train import BATCH, Dataset, Trainer, build_dataset, chain_acceptance, fit
from edgespec.apps.distill.vocab import choose_subset
from edgespec.core import learned_format as fmt
from edgespec.models.gguf_tensors import TargetTensors, target_fingerprint
from edgespec.runtime.errors import EdgeSpecError


def run(cfg: DistillConfig, log: Callable[[str], None] = print) -> Path:
    from tqdm import tqdm

    t_start = time.monotonic()
    budget_s = cfg.budget_minutes * 60.0
    end = t_start + budget_s
    train_prompts, held_ids = split_prompts(cfg.suites, cfg.holdout)
    out = check_out(Path(cfg.out)) if cfg.out else None  # before anything is loaded or trained
    if cfg.corpus:
        corpus.documents(cfg.corpus, cfg.seed)  # so is --corpus: a missing or binary one is refused now
    model, session, tensors = load_target(cfg)
    out = out or check_out(fmt.store_dir() / Path(model.path).stem)
    log(f"distilling a drafter for {Path(model.path).name} into {out} (budget {cfg.budget_minutes:g} min; "
        f"{len(train_prompts)} training prompts, {len(held_ids)} held out)")

    bar = tqdm(total=round(budget_s), unit="s", desc="collect", file=sys.stderr,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [ETA {remaining}] {postfix}")

    def tick(info: str) -> None:
        bar.n = min(round(time.monotonic() - t_start), bar.total)
        bar.set_postfix_str(info, refresh=True)

    try:
        collect_end = t_start + cfg.collect_share * budget_s
        seqs = collect(model, session, train_prompts, cfg, collect_end,
                       lambda kind, n: tick(f"{n} tokens read ({kind})"))
        fit_seqs, held = hold_out(seqs)
        eog = [t for t in range(model.n_vocab) if model.is_eog(t)][:8]
        subset = choose_subset(fit_seqs, model.n_vocab, cfg.vocab, eog, tensors.token_scores())
        head = tensors.output_rows(subset)
        data = build_dataset(fit_seqs)
        heldout = build_dataset(held) if held else None
        trainer = Trainer(data, tensors.cached_embeddings, head, cfg.hidden, cfg.seed)
        bar.set_description("train")
        export_reserve = min(30.0, 0.1 * budget_s)
        fit(trainer, cfg.lr, end - export_reserve, cfg.seed, tick)
        bar.set_description("export")
        tick("evaluating")
        figures = evaluate(trainer, held, heldout, subset)  # before the record: its seconds count the evaluation
        manifest = fmt.Manifest(
            target_file=Path(model.path).name,
            target=target_fingerprint(model.path),  # what LearnedDrafter checks
            n_embd=model.n_embd,
            n_vocab=model.n_vocab,
            vocab_subset=[int(t) for t in subset],
            design=design(cfg, trainer, subset),
            training=training_record(cfg, held_ids, seqs, fit_seqs, trainer, t_start),
            heldout=figures,
        )
        path = export(out, trainer, subset, manifest, heldout)
        bar.n = bar.total
        bar.close()
    except BaseException:
        bar.close()
        raise
    finally:
        session.close()
    log(f"wrote {path} ({summary(manifest)})")
    log(f"use it: python app.py --target {cfg.target} --draft learned:{path}   (or ngram+learned:{path})")
    return path


def load_target(cfg: DistillConfig):
    """The target model, a session on it (for the self-generated answers) and its GGUF tensors
    (embeddings, output rows), checked to be the same model's."""
    from edgespec.models.loader import RuntimeOptions, load_model
    from edgespec.service.session import Session

    opts = RuntimeOptions(n_ctx=cfg.n_ctx, n_threads=cfg.threads)
    model = load_model(cfg.target, opts)
    session = Session(model, opts)
    tensors = TargetTensors(model.path)
    if tensors.n_embd != model.n_embd or tensors.n_vocab < model.n_vocab:
        raise EdgeSpecError(f"{Path(model.path).name}: GGUF embeddings ({tensors.n_vocab}x{tensors.n_embd}) do not match "
                            f"the model ({model.n_vocab}x{model.n_embd})")
    return model, session, tensors


def hold_out(seqs: Sequence[Record]) -> tuple[list[Record], list[Record]]:
    """(texts to train on, texts held out for the manifest's figures): every 10th text, at least
    one once there are two."""
    held_at = set(range(9, len(seqs), 10)) or ({len(seqs) - 1} if len(seqs) >= 2 else set())
    held = [s for i, s in enumerate(seqs) if i in held_at]
    fit_seqs = [s for i, s in enumerate(seqs) if i not in held_at]
    return fit_seqs, held


def design(cfg: DistillConfig, trainer: Trainer, subset: np.ndarray) -> dict:
    """The manifest's description of the drafter."""
    return {
        "kind": "mlp-feature-regression",
        "inputs": "target final hidden state (or own prediction) + input embedding of the next token",
        "hidden": cfg.hidden,
        "head": f"target output rows for {len(subset)} most frequent tokens (FR-Spec)",
        "parameters": int(sum(v.size for v in trainer.mlp.p.values())),
    }


def training_record(cfg: DistillConfig, held_ids: list[str], seqs: Sequence[Record], fit_seqs: Sequence[Record],
                    trainer: Trainer, t_start: float) -> dict:
    """The manifest's account of what the drafter was trained on and how long it took."""
    return {
        "suites": cfg.suites,
        "held_out_ids": held_ids,
        "corpus_ids": sorted({s.qid for s in fit_seqs if s.kind == "corpus"}),
        "generated_ids": sorted({s.qid for s in fit_seqs if s.kind == "generated"}),
        "offline_corpus": cfg.corpus,
        "collection": collection_rates(seqs),
        "tokens": int(sum(len(s.tokens) for s in fit_seqs)),
        "examples": int(len(trainer.data.h)),
        "steps": trainer.steps,
        "batch": BATCH,
        "final_loss": round(trainer.loss, 4),
        "seconds": round(time.monotonic() - t_start, 1),
    }


def evaluate(trainer: Trainer, held: Sequence[Record], heldout: Dataset | None, subset: np.ndarray) -> fmt.Heldout:
    """Figures on the held-out texts: top-1 agreement, the subset's coverage and greedy acceptance
    by draft depth (None where there is no held-out text)."""
    top1 = trainer.accuracy(heldout, subset) if heldout is not None else None
    chain = chain_acceptance(trainer, held, subset)
    coverage = float(np.isin(heldout.argmax_next, subset).mean()) if heldout is not None else None
    return fmt.Heldout(
        sequences=len(held),
        tokens=int(sum(len(s.tokens) for s in held)),
        top1_agreement=None if top1 is None else round(top1, 4),
        subset_coverage=None if coverage is None else round(coverage, 4),
        chain_acceptance=chain,
    )


def summary(manifest: fmt.Manifest) -> str:
    """The run's figures in words; a figure the held-out data could not give is said so, not None."""
    tr, h = manifest.training, manifest.heldout
    parts = [f"{tr['tokens']} training tokens, {tr['steps']} steps, {tr['seconds']:.0f} s"]
    rates = [f"{kind} {row['tokens_per_s']} tok/s" for kind, row in sorted(tr.get("collection", {}).items())
             if row.get("tokens_per_s")]
    if rates:
        parts.append("collected at " + ", ".join(rates))
    if h.top1_agreement is None:
        parts.append("too little text to hold any out for evaluation (raise --budget-minutes)")
    else:
        parts.append(f"held-out top-1 agreement {100 * h.top1_agreement:.1f}%")
        if h.subset_coverage is not None:
            parts.append(f"the vocabulary subset covers {100 * h.subset_coverage:.1f}% of the target's tokens")
    depths = [f"{100 * a:.0f}%" for a in h.chain_acceptance if a is not None]
    if depths:
        parts.append(f"greedy acceptance at draft depth 1..{len(depths)}: {', '.join(depths)}")
    else:
        parts.append("no held-out generated answer to measure acceptance by draft depth")
    return "; ".join(parts)


def add_args(ap: argparse.ArgumentParser) -> None:
    """The command's flags; every default is DistillConfig's."""
    d = {f.name: f.default for f in fields(DistillConfig)}
    ap.add_argument("--target", required=True, help="target model: .gguf path or bundled name")
    ap.add_argument("--out", default=None, help="drafter folder (default: the drafter store, named after the target)")
    ap.add_argument("--suite", action="append", default=[], help=f"prompt suite (.jsonl or shipped name; repeatable; default {DEFAULT_SUITE})")
    ap.add_argument("--budget-minutes", type=float, default=d["budget_minutes"],
                    help=f"whole run, collection + training + export (default {d['budget_minutes']:g})")
    ap.add_argument("--holdout", type=int, default=d["holdout"],
                    help=f"first N prompts of each category are never trained on (default {d['holdout']})")
    ap.add_argument("--vocab", type=int, default=d["vocab"], help=f"output vocabulary subset size (FR-Spec; default {d['vocab']})")
    ap.add_argument("--hidden", type=int, default=d["hidden"], help=f"MLP width (default {d['hidden']})")
    ap.add_argument("--corpus", default=d["corpus"],
                    help="also read offline text: 'python' (the installed Python sources) or a file/folder; "
                         "reading is batched, so it can give more tokens per minute than generating")
    ap.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"],
                    help=f"length of each self-generated answer (default {d['max_new_tokens']})")
    ap.add_argument("--seed", type=int, default=d["seed"])
    ap.add_argument("--ctx", type=int, default=d["n_ctx"])
    ap.add_argument("--threads", type=int, default=d["threads"])
    ap.add_argument("--lr", type=float, default=d["lr"], help=argparse.SUPPRESS)  # tests: 0 = an untrained drafter


def main(argv: Sequence[str] | None = None) -> int:
    from edgespec.apps.args import Parser

    ap = Parser(prog="python app.py distill", description="learn a small ONNX drafter from a target model")
    add_args(ap)
    args = ap.parse_args(argv)
    return run_args(args)


def run_args(args: argparse.Namespace) -> int:
    from edgespec.runtime.errors import run_command

    def go() -> int:
        cfg = DistillConfig(target=args.target, out=args.out, suites=args.suite or [DEFAULT_SUITE],
                            budget_minutes=args.budget_minutes, holdout=args.holdout, corpus=args.corpus, vocab=args.vocab,
                            hidden=args.hidden, max_new_tokens=args.max_new_tokens, seed=args.seed,
                            n_ctx=args.ctx, threads=args.threads, lr=args.lr)
        try:
            run(cfg)
        except KeyboardInterrupt:
            print("\nno drafter was written", file=sys.stderr)
            raise
        return 0

    return run_command(go)
