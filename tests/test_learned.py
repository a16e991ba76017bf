"""The learned ONNX drafter, end to end on the real bundled SmolLM2: `app.py distill` trains one in
the test itself (tiny budget), then it is loaded with ONNX Runtime's CPU provider, proposes tokens
with their q distributions, is verified losslessly by the engine, and refuses what it must refuse."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from edgespec.core import learned_format as fmt
from edgespec.core.drafters import build
from edgespec.core.drafters.combined import CombinedDrafter
from edgespec.core.drafters.ngram import NgramDrafter
from edgespec.core.drafters.onnx import LearnedDrafter
from edgespec.core.engine import DRAFT, Engine, FixedGamma, GenerationConfig
from edgespec.core.sampling import SamplingParams, process
from edgespec.models.gguf_tensors import target_fingerprint
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.session import Reply
from tests.batched_path import BatchedPath
from tests.conftest import run_app

BUDGET_MIN = 0.75
# Held-out top-1 agreement the fixture's drafter must reach (held out: one generated answer). Set
# above what an untrained drafter (--lr 0) reaches, and below what the budget trains even under
# load (how many tokens the budget collects matters more than the steps).
# Lossless verification hides an untrained drafter everywhere else (its drafts are only rejected),
# so this is the check that training trained.
MIN_TOP1 = 0.015


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    """A drafter distilled from SmolLM2 by the real command, within a tiny budget."""
    out = tmp_path_factory.mktemp("learned") / "smol-drafter"
    t0 = time.monotonic()
    res = run_app("distill", "--target", "smollm2-135m", "--out", str(out), "--budget-minutes", str(BUDGET_MIN),
                  "--vocab", "4096", "--hidden", "128", "--max-new-tokens", "32", timeout=240)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-2000:]
    assert took < 120, f"distill took {took:.0f} s"
    assert "wrote" in res.stdout and "ETA" in res.stderr  # a progress bar with an ETA
    assert "None" not in res.stdout, res.stdout  # the summary says what it could not measure, in words
    return out


def test_distill_writes_a_checked_onnx_drafter_and_manifest(drafter_dir, smollm2):
    m = json.loads((drafter_dir / fmt.MANIFEST).read_text())
    assert m["format"] == fmt.FORMAT and (drafter_dir / fmt.ONNX_FILE).stat().st_size > 0
    assert m["target"] == target_fingerprint(smollm2.path)
    assert m["n_embd"] == smollm2.n_embd == 576
    subset = np.asarray(m["vocab_subset"])
    assert len(subset) == 4096 and len(np.unique(subset)) == 4096 and subset.max() < smollm2.n_vocab
    tr = m["training"]
    assert tr["steps"] > 0 and tr["tokens"] > 0 and tr["held_out_ids"]
    trained = set(tr["corpus_ids"]) | set(tr["generated_ids"])
    assert trained and not trained & set(tr["held_out_ids"])  # never trains on held-out prompts
    assert m["heldout"]["tokens"] > 0 and m["heldout"]["top1_agreement"] >= MIN_TOP1, m["heldout"]
    assert not list(drafter_dir.parent.glob(".*part-*"))  # no temporary folder left behind


def test_onnx_runtime_cpu_provider_and_proposals(drafter_dir, smollm2):
    d = LearnedDrafter(drafter_dir, smollm2)
    assert d.provider == "CPUExecutionProvider" and d.name.endswith("@CPU")
    assert 0 < d.draft_cost_s() < 1.0
    prompt = smollm2.tokenize("The sea is")
    d.begin(prompt, SamplingParams(0.0))
    assert len(d.propose(prompt, 4)) == 0  # no hidden state of the target yet: nothing to propose
    smollm2.reset()
    smollm2.decode(prompt, n_logits=len(prompt), hidden=True)
    # the hidden state that produced the newest committed token (the prompt's last) is row -2
    hidden = smollm2.last_hidden[-2].copy()
    ctx = prompt
    d.observe_hidden(hidden)
    d.commit(ctx, 0)
    greedy = d.propose(ctx, 4)
    assert len(greedy) == 4 and greedy.probs is None and greedy.source == "learned"
    assert set(greedy.tokens.tolist()) <= set(d.subset.tolist())
    # sampled drafts come with q over the whole vocabulary, zero outside the subset
    d.begin(prompt, SamplingParams(0.8, seed=3))
    d.observe_hidden(hidden)
    d.commit(ctx, 0)
    sampled = d.propose(ctx, 3)
    assert sampled.probs.shape == (3, smollm2.n_vocab)
    np.testing.assert_allclose(sampled.probs.sum(1), 1.0, rtol=1e-5)
    outside = np.setdiff1d(np.arange(smollm2.n_vocab), d.subset)
    assert sampled.probs[:, outside].max() == 0.0
    for tok, q in zip(sampled.tokens, sampled.probs, strict=True):
        assert q[tok] > 0
    # the first q is the processed drafter distribution at the target's hidden state
    _, logits = d.step(hidden[None, :], ctx[-1])
    full = np.full(smollm2.n_vocab, -np.inf, dtype=np.float32)
    full[d.subset] = logits
    np.testing.assert_allclose(sampled.probs[0], process(full, SamplingParams(0.8, seed=3)), rtol=1e-5, atol=1e-9)


def test_greedy_with_learned_drafter_equals_same_path_reference(drafter_dir, smollm2):
    cfg = GenerationConfig(max_tokens=40)
    for text in ("Write a short poem about the sea.", "What is the capital of France? Answer:"):
        prompt = smollm2.tokenize(smollm2.apply_chat_template([{"role": "user", "content": text}]), parse_special=True)
        ref = Reply.collect(Engine(BatchedPath(smollm2), None).generate(prompt, cfg))
        for gamma in (1, 3):
            drafter = LearnedDrafter(drafter_dir, smollm2)
            target = BatchedPath(smollm2)
            spec = Reply.collect(Engine(target, drafter, FixedGamma(gamma)).generate(prompt, cfg))
            assert target.padded_calls > 0  # plain steps (nothing drafted) were padded, hidden states too
            assert spec.tokens == ref.tokens, f"gamma={gamma} {text!r}"
            assert spec.stats.drafted > 0  # it did draft after the first (plain) step
            drafted_by = {b for b, s in zip(spec.drafted_by, spec.sources, strict=True) if s == DRAFT}
            # Every accepted draft is shown as learned's, except an accepted end-of-generation token
            # (it ends the reply, so it is counted as accepted but never shown).
            shown = spec.drafted_by.count("learned")
            assert drafted_by <= {"learned"} and shown in (spec.stats.accepted, spec.stats.accepted - spec.stats.end_tokens)


def test_sampled_verification_with_learned_drafter_is_reproducible(drafter_dir, smollm2):
    prompt = smollm2.tokenize("Once upon a time")
    cfg = GenerationConfig(max_tokens=32, sampling=SamplingParams(0.8, seed=11))
    runs = [Reply.collect(Engine(smollm2, LearnedDrafter(drafter_dir, smollm2), FixedGamma(2)).generate(prompt, cfg))
            for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and runs[0].finish_reason == runs[1].finish_reason
    # the whole budget, or the model's own end: the drafter is distilled within a time budget, so which
    # sample the seed gives (and where it ends) moves with the machine's speed
    assert (len(runs[0].tokens), runs[0].finish_reason) == (32, "length") or runs[0].finish_reason == "eog", runs[0]
    assert runs[0].stats.drafted > 0


def test_combined_drafter_names_each_source(drafter_dir, smollm2):
    text = ("Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, oranges, "
            "apples, pears, plums, cherries, grapes, lemons, limes, oranges.")
    prompt = smollm2.tokenize(smollm2.apply_chat_template([{"role": "user", "content": text}]), parse_special=True)
    combined = CombinedDrafter(NgramDrafter(1, 16), LearnedDrafter(drafter_dir, smollm2))
    r = Reply.collect(Engine(smollm2, combined, FixedGamma(3)).generate(prompt, GenerationConfig(max_tokens=48)))
    by = [b for b, s in zip(r.drafted_by, r.sources, strict=True) if s == DRAFT]
    assert by and set(by) <= {"ngram", "learned"} and "ngram" in by
    assert all(b == "" for b, s in zip(r.drafted_by, r.sources, strict=True) if s != DRAFT)


def test_registry_and_bare_path_select_the_learned_drafter(drafter_dir, smollm2):
    opts = RuntimeOptions()
    assert isinstance(build(str(drafter_dir), smollm2, opts), LearnedDrafter)
    assert isinstance(build(f"learned:{drafter_dir}", smollm2, opts), LearnedDrafter)
    assert isinstance(build(f"ngram+learned:{drafter_dir}", smollm2, opts), CombinedDrafter)


def test_drafter_for_another_target_is_refused(drafter_dir, gemma):
    with pytest.raises(EdgeSpecError, match="made for SmolLM2.*not gemma"):
        LearnedDrafter(drafter_dir, gemma)


@pytest.mark.parametrize("damage, message", [
    ("other-target", "was made for"),
    ("corrupt-onnx", "ONNX Runtime cannot load"),
    ("no-manifest", "has no manifest.json"),
    ("bad-manifest", "not readable JSON"),
])
def test_bad_drafter_files_are_one_line_errors(drafter_dir, tmp_path, damage, message):
    bad = tmp_path / "bad"
    shutil.copytree(drafter_dir, bad)
    target = "smollm2-135m"
    if damage == "other-target":
        target = "gemma3-270m"
    elif damage == "corrupt-onnx":
        data = (bad / fmt.ONNX_FILE).read_bytes()
        (bad / fmt.ONNX_FILE).write_bytes(data[: len(data) // 3])
    elif damage == "no-manifest":
        (bad / fmt.MANIFEST).unlink()
    elif damage == "bad-manifest":
        (bad / fmt.MANIFEST).write_text("{not json")
    res = run_app("--headless", "--target", target, "--draft", f"learned:{bad}", "--prompt", "hi", "--max-tokens", "4",
                  timeout=120)
    assert res.returncode != 0
    err = res.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error:"), err
    assert message in err


def test_distill_bad_input_is_one_line():
    res = run_app("distill", "--target", "smollm2-135m", "--budget-minutes", "0", timeout=60)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == ["error: --budget-minutes must be > 0, got 0.0"]


@pytest.mark.parametrize("out, message", [
    ("/proc/x", "cannot write the drafter to /proc/x: /proc takes no new folders"),
    ("/sys/x", "cannot write the drafter to /sys/x: /sys takes no new folders"),
])
def test_distill_refuses_an_unwritable_out_before_training(out, message):
    t0 = time.monotonic()
    res = run_app("distill", "--target", "smollm2-135m", "--budget-minutes", "0.5", "--out", out, timeout=120)
    took = time.monotonic() - t0
    assert res.returncode == 1 and "Traceback" not in res.stderr
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}"), res.stderr
    assert "collect" not in res.stderr and took < 25, f"{took:.0f} s"  # refused before the 30-second budget ran


def test_distill_refuses_an_existing_file_or_foreign_folder_and_leaves_them(tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("my notes\n")
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    for out, message in [(precious, "is an existing file, not a drafter folder"),
                         (folder, "is a folder with other files and no drafter (manifest.json) in it")]:
        res = run_app("distill", "--target", "smollm2-135m", "--budget-minutes", "0.3", "--out", str(out), timeout=120)
        assert res.returncode == 1 and "Traceback" not in res.stderr
        assert res.stderr.strip().splitlines() == [f"error: --out {out} {message}; name a new folder"], res.stderr
    assert precious.read_text() == "my notes\n" and (folder / "cat.jpg").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "photos"]  # nothing moved aside or left behind
