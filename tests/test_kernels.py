"""The small-batch kernels (native/smallbatch): the set-up builds and proves them, fast mode runs
them, and they give the per-row path's logits bit for bit on real weights. Each kernel set runs in
a child process (a process loads one set of CPU modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.apps.buildcheck import PROB_TOLERANCE, softmax
from edgespec.runtime import backend
from edgespec.runtime import llama as runtime
from tests.conftest import ROOT

KERNELS = backend.kernels_dir()
needs_kernels = pytest.mark.skipif(
    KERNELS is None or not backend.cpu_modules(KERNELS),
    reason="the set-up built no small-batch kernel modules here (not x86 with loadable CPU modules, or "
           "their build failed: scripts/setup.sh says why)")

# A fixed text; every batch size in KS is decoded after its first PREFILL tokens, so each K runs the
# kernels with K columns (past 16 too: the small-batch path takes up to 32 rows, in calls of 8; past 32
# a prompt's worth, which the AVX2 build's repacked Q4_K path takes as well).
TEXT = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(values)\n\n\ndef spread(values):\n    return max(values) - min(values)\n\n"
        "print(mean([1, 2, 3, 4]), spread([1, 2, 3, 4]))\n")
CHILD = """
import json, sys
import numpy as np
from edgespec.runtime import llama as runtime
path, out = sys.argv[1], sys.argv[2]
m = runtime.Model(path, n_ctx=256, n_batch=64, flash_attn="off", repack=sys.argv[4] == "repack")
toks = m.tokenize(sys.argv[3], add_special=True)
prefill, ks = json.loads(sys.argv[5])
# the prefill one token at a time, where both kernel sets compute the per-row arithmetic: the same cache
for t in toks[:prefill]:
    m.decode([t], n_logits=0)
rows = []
for k in ks:
    assert prefill + k <= len(toks)
    m.truncate(prefill)
    rows.append(np.array(m.decode(toks[prefill:prefill + k], n_logits=k)))
# then the tokens of the largest verification-sized batch again, one at a time (plain decoding's logits)
m.truncate(prefill)
rows += [np.array(m.decode([t], n_logits=1)) for t in toks[prefill:prefill + max(k for k in ks if k <= 32)]]
np.save(out, np.concatenate(rows))
print(json.dumps(runtime.backend_info().to_dict()))
"""


KS = (*range(1, 9), 17, 24, 40)
PREFILL = 24


VERIFY_KS = [k for k in KS if k <= 32]  # batches the size of a verification pass
NO_F16 = {"GGML_SMALLBATCH_F16": "no"}  # attention summed as the unpatched module sums it


def _by_k(rows: np.ndarray) -> dict[int, np.ndarray]:
    """The stacked rows of the batches of KS -> {K: [K, vocab]}; {0: the tokens decoded one at a time}."""
    ends = np.cumsum(KS)
    out = {k: rows[end - k : end] for k, end in zip(KS, ends, strict=True)}
    out[0] = rows[ends[-1]:]
    return out


def _logits(path: Path, out: Path, kernels: str, extra_env: dict | None = None,
            repack: bool = True) -> tuple[np.ndarray, dict]:
    env = {**os.environ, **(extra_env or {})}
    env.pop("EDGESPEC_KERNELS", None)
    if kernels == "stock":
        env["EDGESPEC_KERNELS"] = "stock"
    res = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), TEXT, "repack" if repack else "plain",
                          json.dumps([PREFILL, KS])],
                         cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return np.load(out), json.loads(res.stdout.strip().splitlines()[-1])


def _model_path(name: str) -> Path | None:
    """An installed model, or NAME:f16 / NAME:mxfp4, a copy of bundled NAME in that format, made as a user makes
    one and cached outside the tree: F16 by llama.cpp's own quantizer (a target whose weights, not only its
    attention, go through the F16 kernel), MXFP4 by the quant tool's real GGUF MXFP4 tensors (llama.cpp repacks
    them eight rows at a time, and the small-batch MXFP4 kernel takes those)."""
    from edgespec.apps.quant.convert import convert
    from edgespec.models import resolve_local
    from edgespec.models.bundled import bundled_path
    from edgespec.models.derive import DERIVED_DIR, requantize

    model, _, to = name.partition(":")
    if not to:
        return resolve_local(name)
    src = bundled_path(model)
    base, _, quant = src.stem.rpartition(".")
    dst = DERIVED_DIR / f"{base}.{to.upper()}-from-{quant}.gguf"
    if not dst.is_file():
        if to == "mxfp4":
            DERIVED_DIR.mkdir(parents=True, exist_ok=True)
            convert(src, dst, "mxfp4", progress=False)
        else:
            requantize(src, dst, to)
    return dst


@needs_kernels
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m:mxfp4",
                                  pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.slow)])
def test_small_batch_logits_match_the_unpatched_module(name, tmp_path):
    """Batches of 1..8, 17, 24 and 40 rows after the same 24-token prefill. For 1-3 rows the unpatched module runs
    one per-row kernel call per weight row and token (Q6_K vec_dot, the repacked Q4_K gemv), which
    the small-batch kernels reproduce for every row: the logits are equal bit for bit. From 4 rows
    on it runs the 4-row Q4_K kernel (and tiled Q6_K at 8 and past 16; the small-batch module too past 32),
    whose float sums are ordered otherwise:
    no token's probability moves by more than 0.15 (a near-tie's top token may swap). Gemma-3-270M's
    Q4_K_M holds Q6_K and Q4_K tensors; the real 1.5B target, when installed, 354 MB of Q6_K and
    757 MB of Q4_K. An MXFP4 copy of SmolLM2 runs ggml's repacked MXFP4 gemv for 1-3 rows and the 4-row gemm
    past that, where the small-batch module runs its MXFP4 kernel."""
    path = _model_path(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    # attention as the unpatched module sums it (F16 kernel off): the quantized kernels alone compared
    got, info = _logits(path, tmp_path / "smallbatch.npy", "smallbatch", NO_F16)
    ref, ref_info = _logits(path, tmp_path / "stock.npy", "stock")
    off, _ = _logits(path, tmp_path / "off.npy", "smallbatch", {"GGML_CPU_SMALLBATCH": "0"})
    assert info["kernels"] == "smallbatch" and ref_info["kernels"] == "stock"
    assert got.shape == ref.shape == (sum(KS) + max(VERIFY_KS), ref.shape[1])
    assert float(np.max(np.abs(off - ref))) == 0.0  # the switch gives the unpatched arithmetic back
    a, b = _by_k(got), _by_k(ref)
    assert float(np.max(np.abs(a[0] - b[0]))) == 0.0, "a token decoded alone: the logits differ"
    for k in KS:
        if k <= 3:
            assert float(np.max(np.abs(a[k] - b[k]))) == 0.0, f"K={k}: the per-row kernels' logits differ"
        else:
            moved = float(np.max(np.abs(softmax(a[k]) - softmax(b[k]))))
            assert moved < PROB_TOLERANCE, f"K={k}: a token's probability moved by {moved}"


@needs_kernels
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m", "smollm2-135m:f16",
                                  pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.slow)])
def test_a_verification_pass_gives_each_token_its_logits_decoded_alone(name, tmp_path):
    """With the F16 kernel (attention: vec_dot_f16's sums) beside the quantized ones, every op of a pass
    over 2..32 rows computes each row as a pass over that row alone: a batch of K tokens gets, row for
    row, the logits of decoding them one at a time, bit for bit (the unpatched module's sgemm attention
    moves them by up to 0.5-1.3). So greedy speculation verifies against plain decoding's own logits.
    An F16 target (SmolLM2 converted) runs its weights through the F16 kernel as well."""
    path = _model_path(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    got, info = _logits(path, tmp_path / "smallbatch.npy", "smallbatch")
    if not info["kernel_f16"]:
        pytest.skip("this module has no F16 kernel (no AVX2): attention runs llamafile's sgemm")
    a = _by_k(got)
    for k in VERIFY_KS:
        diff = float(np.max(np.abs(a[k] - a[0][:k])))
        assert diff == 0.0, f"K={k}: the batch's logits differ from decoding its tokens alone by up to {diff}"
    ref, _ = _logits(path, tmp_path / "stock.npy", "stock")
    b = _by_k(ref)
    assert max(float(np.max(np.abs(b[k] - b[0][:k]))) for k in VERIFY_KS if k > 1) > 0.0, \
        "the unpatched module's batches gave the single-token logits too: the test shows nothing here"


@needs_kernels
def test_greedy_speculation_prints_what_plain_decoding_prints(tmp_path):
    """Fast mode, the engine as users run it (no padding of plain steps): n-gram speculation with fixed
    and automatic draft lengths gives the plain greedy tokens, token for token, on code edits where the
    drafts are long and on prose where many are rejected."""
    from edgespec.models.loader import RuntimeOptions
    from edgespec.service.session import Request, Session
    from edgespec.service.suites import load_suites

    session = Session.load("gemma3-270m", RuntimeOptions(n_threads=2))
    try:
        if not runtime.backend_info().kernel_f16:
            pytest.skip("this module has no F16 kernel (no AVX2): attention runs llamafile's sgemm")
        prompts = [p.text for p in load_suites(["code_edit"])[:2]] + [
            "Write a short story about a lighthouse keeper who finds a message in a bottle."]
        for text in prompts:
            plain = session.run(Request(text=text, framing="question", draft="none", gamma="0", max_tokens=80)).tokens
            for gamma in ("4", "12", "auto"):
                spec = session.run(Request(text=text, framing="question", draft="ngram", gamma=gamma, max_tokens=80))
                assert spec.stats.accepted > 0
                assert spec.tokens == plain, f"gamma {gamma}: speculation's tokens differ from plain decoding's"
    finally:
        session.close()


@needs_kernels
def test_q6_k_kernel_equals_vec_dot_for_every_batch_size(gemma_path, tmp_path):
    """With ggml's tiled K-quant path and weight repacking off in both, the unpatched module runs
    every K-quant mat-mul as one vec_dot per weight row and token, whatever the batch; the
    small-batch Q6_K kernel, 1-8 tokens at a time (batches of 17 and 24 in calls of up to 8), gives the
    same logits bit for bit (Gemma-3-270M's
    Q6_K ffn_down tensors are the ones it computes)."""
    tiled_off = {"GGML_CPU_TILED_MM": "0", **NO_F16}
    got, _ = _logits(gemma_path, tmp_path / "smallbatch.npy", "smallbatch", tiled_off, repack=False)
    ref, _ = _logits(gemma_path, tmp_path / "stock.npy", "stock", tiled_off, repack=False)
    assert float(np.max(np.abs(got - ref))) == 0.0


@needs_kernels
def test_legacy_quant_kernels_equal_vec_dot_for_every_batch_size(smollm2_path, tmp_path):
    """SmolLM2-135M, the default target, is Q4_1 with a Q8_0 output layer (its token embedding). The
    unpatched module computes Q4_1 one vec_dot per weight row and token whatever the batch, and Q8_0
    from 2 rows on with llamafile's tinyBLAS_Q0, whose sums are vec_dot's in the same order; the
    small-batch kernels (smallbatch-legacy.c), 1-8 tokens a call, give the same logits bit for bit at
    every batch size."""
    got, info = _logits(smollm2_path, tmp_path / "smallbatch.npy", "smallbatch", NO_F16)
    ref, ref_info = _logits(smollm2_path, tmp_path / "stock.npy", "stock")
    assert info["kernels"] == "smallbatch" and ref_info["kernels"] == "stock"
    a, b = _by_k(got), _by_k(ref)
    for k in KS:
        assert float(np.max(np.abs(a[k] - b[k]))) == 0.0, f"K={k}: the logits differ"


def _cpu_runs_512_bit_kernels() -> bool:
    """Whether this CPU runs the AVX-512 module, whose kernels have 512-bit forms (GGML_SMALLBATCH_512)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= set(flags.split(":", 1)[1].split())


@needs_kernels
@pytest.mark.skipif(not _cpu_runs_512_bit_kernels(), reason="no AVX-512 VNNI here: the module has only 256-bit kernels")
def test_512_bit_kernels_give_the_256_bit_ones_logits_bit_for_bit(gemma_path, tmp_path):
    """The 512-bit Q4_K and Q6_K kernels (taken by default on AMD Zen 4 and later) compute every row with the per-row kernels' integers and float steps, as the 256-bit ones
    do: the logits of every batch in KS are the same bits either way, with the repacked Q4_K path and
    with the Q6_K kernel (tiled path and repacking off)."""
    for repack, env in ((True, {}), (False, {"GGML_CPU_TILED_MM": "0"})):
        wide, wide_info = _logits(gemma_path, tmp_path / "wide.npy", "smallbatch", {**env, "GGML_SMALLBATCH_512": "yes"},
                                  repack=repack)
        narrow, narrow_info = _logits(gemma_path, tmp_path / "narrow.npy", "smallbatch",
                                      {**env, "GGML_SMALLBATCH_512": "no"}, repack=repack)
        assert (wide_info["kernel_bits"], narrow_info["kernel_bits"]) == (512, 256)  # the module says which ran
        assert float(np.max(np.abs(wide - narrow))) == 0.0, f"repack={repack}: the 512-bit kernels' logits differ"


def _amx_runs_here() -> bool:
    """Whether the loaded small-batch module takes its AMX forms (an AMX-INT8 CPU whose Linux grants the tile
    state): asked of the module itself, in a child process."""
    if KERNELS is None or not backend.cpu_modules(KERNELS):
        return False
    res = subprocess.run([sys.executable, "-c", "from edgespec.runtime import llama as runtime; import json; "
                          "print(json.dumps(runtime.backend_info().to_dict()))"],
                         cwd=ROOT, env={k: v for k, v in os.environ.items() if k not in ("EDGESPEC_KERNELS", "GGML_SMALLBATCH_AMX")},
                         capture_output=True, text=True, timeout=120)
    return res.returncode == 0 and json.loads(res.stdout.strip().splitlines()[-1]).get("kernel_amx") is True


@needs_kernels
@pytest.mark.parametrize("name", ["gemma3-270m", pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.slow)])
def test_amx_kernel_gives_the_vnni_kernels_logits_bit_for_bit(name, tmp_path):
    """On an AMX CPU (Sapphire Rapids and later Xeons) the repacked Q4_K rows of a call of 6-32 rows go through
    tile multiplies (smallbatch-q4_K.c), with every weight row's integer sum and float steps the gemv's: the
    logits of every batch in KS (6, 7 and 8 rows in one call of one tile group, 17 and 24 rows in one call of two
    groups that share the unpacked weights, a 40-row prompt in two such calls) are the same bits as with the AMX
    forms off, and the module says which ran."""
    if not _amx_runs_here():
        pytest.skip("no AMX here (or Linux does not grant the tile state): the module runs the VNNI kernels only")
    path = _model_path(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    amx, amx_info = _logits(path, tmp_path / "amx.npy", "smallbatch", {"GGML_SMALLBATCH_AMX": "yes"})
    vnni, vnni_info = _logits(path, tmp_path / "vnni.npy", "smallbatch", {"GGML_SMALLBATCH_AMX": "no"})
    assert (amx_info["kernel_amx"], vnni_info["kernel_amx"]) == (True, False)
    a, b = _by_k(amx), _by_k(vnni)
    for k in (0, *KS):
        assert float(np.max(np.abs(a[k] - b[k]))) == 0.0, f"K={k}: the AMX kernel's logits differ"


@needs_kernels
def test_fast_mode_runs_the_small_batch_modules_and_stock_is_one_switch_away(smollm2):
    info = runtime.backend_info()
    if os.environ.get("EDGESPEC_KERNELS") == "stock":
        assert info.kernels == "stock"
    else:
        assert info.kernels == "smallbatch" and Path(info.module).parent == KERNELS
    res = subprocess.run([sys.executable, "-c", "from edgespec.runtime import llama as runtime; import json; "
                          "print(json.dumps(runtime.backend_info().to_dict()))"],
                         cwd=ROOT, env={**os.environ, "EDGESPEC_KERNELS": "stock"},
                         capture_output=True, text=True, timeout=120)
    assert json.loads(res.stdout)["kernels"] == "stock"


@needs_kernels
def test_exact_mode_keeps_its_own_kernels():
    """--exact's bit-identical guarantee rests on its llamafile-off modules: never the small-batch set."""
    if not backend.exact_available():
        pytest.skip("exact-mode kernels not built")
    res = subprocess.run([sys.executable, "-c", "from edgespec.runtime import llama as runtime; import json; runtime.set_mode('exact'); "
                          "print(json.dumps(runtime.backend_info().to_dict()))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kernels"] == "stock"


@needs_kernels
def test_a_rejected_module_is_not_loaded(tmp_path):
    """The build check records a module that crashed or differed; fast mode then loads the unpatched one."""
    manifest = backend.read_manifest(backend.lib_dir())
    variant = runtime.backend_info().variant
    rejected = {"checked": {backend.this_cpu().signature: {"kernels": {"crashed": [variant]}}}}
    assert backend._kernel_module(variant, backend.this_cpu().signature, manifest) is not None or \
        os.environ.get("EDGESPEC_KERNELS") == "stock"
    env_dir = os.environ.pop("EDGESPEC_KERNEL_MODULES", None)
    try:
        assert backend._kernel_module(variant, backend.this_cpu().signature, rejected) is None
    finally:
        if env_dir is not None:
            os.environ["EDGESPEC_KERNEL_MODULES"] = env_dir


@needs_kernels
def test_the_set_up_check_proves_the_module_on_each_bundled_model():
    """The set-up's check of the small-batch module, run as the set-up runs it: Gemma brings in the Q6_K,
    repacked Q4_K, Q8_0 and Q5_0 kernels, SmolLM2 the Q4_1 one (a Q4_1 kernel off by one part in 10^7 in d
    was rejected there, "smollm2-135m: their logits differ ... by up to 1.76"; Gemma's check had passed it)."""
    res = subprocess.run([sys.executable, "-m", "edgespec.apps.buildcheck", "--kernel-modules", str(KERNELS), "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "kernels run here and match the unpatched kernels" in res.stdout, res.stdout


def test_benchmark_rows_parse_and_refuse_nonsense():
    from benchmarks.verify_kernels import parse_rows
    from edgespec.runtime.errors import EdgeSpecError

    assert parse_rows("1-4,8,16") == [1, 2, 3, 4, 8, 16]
    for bad in ("", "0-3", "a", "1-", "513"):
        with pytest.raises(EdgeSpecError):
            parse_rows(bad)


def test_benchmark_baseline_env_is_name_value():
    import argparse

    from benchmarks.verify_kernels import baseline_env
    from edgespec.runtime.errors import EdgeSpecError

    ns = argparse.Namespace(baseline_env=["GGML_SMALLBATCH_512=0", "X=a=b"])
    assert baseline_env(ns) == {"GGML_SMALLBATCH_512": "0", "X": "a=b"}
    for bad in ("GGML_SMALLBATCH_512", "=1", " X=1"):
        with pytest.raises(EdgeSpecError, match="NAME=VALUE"):
            baseline_env(argparse.Namespace(baseline_env=[bad]))


def test_benchmark_refuses_threads_that_spin_while_they_wait(capsys, monkeypatch):
    from benchmarks.verify_kernels import main

    assert main(["--rows", "1", "--baseline-env", "OMP_WAIT_POLICY=active"]) == 1
    assert "--baseline-env OMP_WAIT_POLICY=active keeps a waiting child's threads spinning" in capsys.readouterr().err
    monkeypatch.setenv("GOMP_SPINCOUNT", "INFINITE")
    assert main(["--rows", "1"]) == 1
    assert "GOMP_SPINCOUNT=INFINITE" in capsys.readouterr().err


def test_benchmark_refuses_e2e_without_prompts(capsys):
    from benchmarks.verify_kernels import main

    assert main(["--e2e", "--edit-prompts", "0", "--open-prompts", "0"]) == 2
    assert "one must be at least 1" in capsys.readouterr().err
    assert main(["--e2e", "--open-prompts", "-1"]) == 2


def _started_at(pid: int) -> int:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@needs_kernels
def test_benchmark_children_start_in_both_orders():
    """The benchmark child started first ran 1-4% slower than the other with the same modules (2-core
    AMD EPYC), so the two kernel sets' children start in one order for half the rounds and in the
    other for the rest: here the start order of turn 0 and turn 1, read from the kernel's start times."""
    import argparse

    from benchmarks.verify_kernels import KERNEL_SETS, start_children

    args = argparse.Namespace(rows="1", flash_attn="off", at=32, threads=1, baseline=None, baseline_env=[])
    firsts = []
    for turn in (0, 1):
        children = start_children("smollm2-135m", args, turn)
        try:
            assert list(children) == list(KERNEL_SETS)
            assert {c.kernels for c in children.values()} == {"smallbatch", "stock"}
            started = {name: _started_at(c.proc.pid) for name, c in children.items()}
        finally:
            for c in children.values():
                c.close()
        # the second child starts once the first has loaded its model and answered: ticks apart
        assert started["smallbatch"] != started["stock"]
        firsts.append(min(children, key=started.__getitem__))
    assert firsts == ["smallbatch", "stock"]


@needs_kernels
@pytest.mark.parametrize("e2e", [False, True])
def test_benchmark_children_keep_their_thread_count(e2e):
    """With no --threads the children run every core with a fixed count: a count that follows the free
    cores would read the sibling child's round as another process's load and run the next half second
    of passes on one thread (the first K of every round measured single-threaded)."""
    import argparse
    import os

    from benchmarks.verify_kernels import start_children

    args = argparse.Namespace(rows="1", flash_attn="off", at=32, threads=None, baseline=None, baseline_env=[])
    children = start_children("smollm2-135m", args, 0, e2e=e2e)
    try:
        for c in children.values():
            assert c.auto_threads is False
            assert c.threads == len(os.sched_getaffinity(0))
    finally:
        for c in children.values():
            c.close()


@needs_kernels
def test_the_prefetch_level_changes_no_logit(gemma_path, tmp_path):
    """Prefetching the weights into L2 only or into L1 too (GGML_SMALLBATCH_PREFETCH_L2; the default
    depends on the CPU) moves no bit of any batch's logits, and the module says which level ran."""
    env = {"GGML_CPU_TILED_MM": "0"}  # the Q6_K kernel too, not only the repacked Q4_K one
    l2, l2_info = _logits(gemma_path, tmp_path / "l2.npy", "smallbatch", {**env, "GGML_SMALLBATCH_PREFETCH_L2": "yes"})
    l1, l1_info = _logits(gemma_path, tmp_path / "l1.npy", "smallbatch", {**env, "GGML_SMALLBATCH_PREFETCH_L2": "no"})
    assert (l2_info["kernel_prefetch"], l1_info["kernel_prefetch"]) == ("L2", "L1")
    assert float(np.max(np.abs(l2 - l1))) == 0.0


@pytest.mark.parametrize("name", ["GGML_SMALLBATCH_512", "GGML_SMALLBATCH_PREFETCH_L2", "GGML_SMALLBATCH_F16",
                                  "GGML_SMALLBATCH_AMX"])
def test_the_module_switches_are_read_as_yes_or_no(monkeypatch, name):
    """The small-batch module's yes/no switches reach its C code as 1 or 0 (its atoi would read 'yes' as
    0), empty is unset (the module chooses), and a value that is no yes/no is a one-line error naming it."""
    from edgespec.runtime import env
    from edgespec.runtime.errors import EdgeSpecError

    for given, sent in (("yes", "1"), ("On", "1"), ("no", "0"), ("0", "0")):
        monkeypatch.setenv(name, given)
        env.normalize_smallbatch_flags()
        assert os.environ[name] == sent
    monkeypatch.setenv(name, " ")
    env.normalize_smallbatch_flags()
    assert name not in os.environ
    monkeypatch.setenv(name, "wide")
    with pytest.raises(EdgeSpecError, match=name):
        env.normalize_smallbatch_flags()
