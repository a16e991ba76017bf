"""Prove that the installed llama.cpp runs on this processor: `python -m edgespec.apps.buildcheck`.

The set-up runs this before it says "ready". Each candidate CPU kernel variant (best first, as
`edgespec.runtime.backend` would choose it) is tried in a child process that loads the bundled SmolLM2 and
decodes one token and then a batch of four. A child that dies (illegal instruction, segfault) is
reported in one line and its variant is recorded as crashed for this CPU in the build manifest,
so the app never picks it; the next variant is tried. The same is done for the exact-mode kernels.

The small-batch kernel modules (native/smallbatch, built by the set-up for the variant fast mode
runs) are checked against the unpatched module on the bundled Gemma-3-270M (Q6_K, repacked Q4_K, Q8_0
and Q5_0 tensors) and SmolLM2-135M (Q4_1, Q8_0): on each, batches of 1, 2 and 3 rows must give the
logits the unpatched module gives those tokens decoded one at a time, bit for bit (where the module has
its F16 attention kernel, `kernel_f16`; without it, the unpatched module's own 2- and 3-row logits), and
so must each token decoded alone; batches of 4 and 6, where the unpatched module runs the 4-row Q4_K
kernel (its float sums ordered differently), and of 40 (a prompt's worth, past
the 32 rows of a verification: the repacked Q4_K path takes those too), probabilities within 0.15 (a
wrong kernel moves them far more; summation order moves them by hundredths, and can swap a
near-tie's top token, so that is not asked). Where the module takes its AMX forms (`kernel_amx`), every
logit must also equal the module's own with them off (GGML_SMALLBATCH_AMX=0), bit for bit.
A module that crashes or fails either is recorded as rejected for this CPU, and the unpatched one
runs instead.

The GPU backend module (libggml-vulkan.so or libggml-cuda.so, built by the set-up when this machine
has a GPU or EDGESPEC_GPU asks for one) is proved on its device: a child loads it, puts every layer
of the bundled SmolLM2 on the first GPU it finds, and runs greedy plain decoding and n-gram
speculation there (service/devicecheck.py): the speculative tokens must equal the plain ones. Where
the Vulkan module finds no GPU, it is proved on Mesa's software device (lavapipe) if one is
installed (SOFTWARE_VULKAN: how llama.cpp's own CI runs it). A module that fails is not recorded, so
the app never loads it, and the CPU path runs as before.

Exit status 0 when fast mode (and exact mode, when its kernels exist) has a working variant; a
rejected small-batch or GPU module never fails the check.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from edgespec.runtime import backend
from edgespec.runtime.errors import EdgeSpecError, run_command

CHILD_TIMEOUT_S = 300
GPU_CHILD_TIMEOUT_S = 900  # a software Vulkan device on a busy machine decodes about a token a second
# ggml-vulkan on a CPU-type device (Mesa's lavapipe), as llama.cpp's CI job ubuntu-llvmpipe runs it:
# the device is listed only when named, and its f16 and cooperative-matrix paths are left out.
SOFTWARE_VULKAN = {"GGML_VK_VISIBLE_DEVICES": "0", "GGML_VK_DISABLE_F16": "1", "GGML_VK_DISABLE_COOPMAT": "1"}


def _say(msg: str) -> None:
    print(f"\033[1m[setup]\033[0m {msg}", flush=True)


BATCHES = (1, 2, 3, 4, 6, 40)  # rows of the successive decodes of the check (56 in all)
# Past the per-row batch sizes, the most a token's probability may move between the small-batch and the
# unpatched module (summation order of the 4-row kernel moves it by hundredths; a wrong kernel far more).
PROB_TOLERANCE = 0.15
PER_ROW = sum(BATCHES[:3])  # the tokens of the 1-, 2- and 3-row batches


def child(mode: str, model_path: str, logits_out: str | None = None) -> int:
    """Load the model with the chosen kernels and decode batches of BATCHES rows; with
    `logits_out`, save every row's logits there (.npy) for the parent to compare."""
    import numpy as np

    from edgespec.runtime import llama as runtime
    runtime.set_mode(mode)
    model = runtime.Model(model_path, n_ctx=256, n_batch=64, flash_attn="off" if mode == "exact" else "auto",
                          repack=mode != "exact", device=backend.CPU_DEVICE)
    toks = model.tokenize("The quick brown fox jumps over the lazy dog. It was not amused, and it said so at length. "
                          "The fox, who had heard it all before, went on to the river, drank, and slept under "
                          "an old oak until the evening bells of the village rang seven times.", add_special=True)
    assert len(toks) >= sum(BATCHES), len(toks)
    rows, at = [], 0
    for k in BATCHES:
        rows.append(np.array(model.decode(toks[at : at + k], n_logits=k)))
        at += k
    if not all(np.isfinite(r).all() for r in rows):
        print(json.dumps({"ok": False, "why": "non-finite logits"}))
        return 1
    if logits_out:
        # then the tokens of the 1-, 2- and 3-row batches again, one at a time (plain decoding's logits)
        model.reset()
        rows += [np.array(model.decode([t], n_logits=1)) for t in toks[:PER_ROW]]
        np.save(logits_out, np.concatenate(rows))
    info = runtime.backend_info()
    print(json.dumps({"ok": True, **info.to_dict()}))
    model.close()
    return 0


def gpu_child(model_path: str) -> int:
    """Load the model on the default device (a GPU where the GPU module found one) and compare greedy
    n-gram speculation with plain decoding there; print one JSON line."""
    from edgespec.models.loader import RuntimeOptions
    from edgespec.runtime import llama as runtime
    from edgespec.service.devicecheck import greedy_runs
    from edgespec.service.session import Session

    runtime.lib()
    if not runtime.backend_info().others:
        print(json.dumps({"ok": False, "why": "llama.cpp did not load the GPU module"}))
        return 0
    device = backend.choose_device(None)
    if not device.is_gpu:
        print(json.dumps({"ok": False, "no_device": True, "why": "the GPU module found no GPU"}))
        return 0
    session = Session(runtime.Model(model_path, n_ctx=512, n_batch=64), RuntimeOptions(n_ctx=512))
    try:
        runs = greedy_runs(session, ["ngram"], gamma=3, max_tokens=8)  # short: a software device is slow
        report = {"ok": all(r.ok for r in runs), "device": device.name, "description": device.description,
                  "layers": session.target.layers_on_device, "runs": [r.to_dict() for r in runs]}
    finally:
        session.close()
    print(json.dumps(report))
    return 0


def prove_gpu(directory: Path | None, manifest: dict, model_path: str) -> bool:
    """Does the GPU module in `directory` run the bundled model on its device and give plain
    decoding's tokens with speculation? Recorded (`gpu_modules`, `gpu`) only when it does."""
    manifest.pop("gpu_modules", None)
    modules = backend.gpu_modules(directory)
    if not modules:
        manifest["gpu"] = {"ok": False, "why": "not built"}
        return False
    kind = modules[0].name.split("ggml-")[1].split(".")[0]
    env = {"EDGESPEC_GPU_MODULES": str(directory)}
    rc, tail = _run_child("gpu", model_path, env, timeout=GPU_CHILD_TIMEOUT_S)
    report = json.loads(tail) if rc == 0 else {"ok": False, "why": _death(rc) + (f": {tail}" if tail else "")}
    software = kind == "vulkan" and report.get("no_device")
    if software:  # no GPU: the software device, where Mesa provides one
        rc, tail = _run_child("gpu", model_path, {**env, **SOFTWARE_VULKAN}, timeout=GPU_CHILD_TIMEOUT_S)
        report = json.loads(tail) if rc == 0 else {"ok": False, "why": _death(rc) + (f": {tail}" if tail else "")}
    if report.get("ok"):
        manifest["gpu_modules"] = str(directory.resolve())
        manifest["gpu"] = {"ok": True, "kind": kind, "device": report["device"], "description": report["description"],
                           "software": bool(software), "layers": report["layers"]}
        where = f"{report['device']} ({report['description']}{', a software device' if software else ''})"
        _say(f"the {kind} GPU module runs here: every layer on {where}, greedy speculation equals plain decoding")
        return True
    why = report.get("why")
    if why is None:  # ran, but a speculative run differed beyond a near-tie
        bad = next(r for r in report["runs"] if not r["ok"])
        why = (f"greedy {bad['draft']} speculation differs from plain decoding at token {bad['divergence']['position']} "
               f"(top-2 gap {bad['divergence']['top2_gap']:.2f})")
    manifest["gpu"] = {"ok": False, "kind": kind, "why": why}
    _say(f"the {kind} GPU module is not used ({why}); models run on the CPU")
    return False


def _death(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name.replace("SIGILL", "Illegal instruction").replace("SIGSEGV", "segfault")
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _run_child(mode: str, model_path: str, env: dict[str, str], logits_out: str | None = None,
               timeout: int = CHILD_TIMEOUT_S) -> tuple[int, str]:
    """(exit status, last stderr line) of a child; on success the tail is its JSON report instead."""
    cmd = [sys.executable, "-m", "edgespec.apps.buildcheck", "--child", mode, "--model", model_path]
    if logits_out:
        cmd += ["--logits-out", logits_out]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return 1, f"no answer within {timeout} s"
    if res.returncode == 0:
        out = [ln for ln in (res.stdout or "").strip().splitlines() if ln.startswith("{")]
        return 0, (out[-1] if out else "{}")
    lines = [ln for ln in (res.stderr or "").strip().splitlines() if ln.strip()]
    return res.returncode, (lines[-1] if lines else "")


def softmax(logits):
    """Row-wise probabilities of [rows, vocab] logits."""
    import numpy as np

    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# the bundled models the small-batch modules are proved on, and the kernels each brings in: Gemma the
# Q6_K, repacked Q4_K, Q8_0 and Q5_0 ones, SmolLM2 the Q4_1 one (both: attention's F16 kernel)
KERNEL_MODELS = ("gemma3-270m", "smollm2-135m")


def _compare_kernels(model: str, env: dict[str, str]) -> str | None:
    """Decode the check's batches on `model` with the small-batch module and with the unpatched one; why
    they disagree, or None."""
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        got, ref = Path(tmp) / "smallbatch.npy", Path(tmp) / "stock.npy"
        rc, tail = _run_child("fast", model, env, str(got))
        if rc != 0:
            return _death(rc) + (f": {tail}" if tail and rc > 0 else "")
        if (info := json.loads(tail)).get("kernels") != "smallbatch":
            return "the child did not load them"
        rc, tail = _run_child("fast", model, {**env, "EDGESPEC_KERNELS": "stock"}, str(ref))
        if rc != 0:
            return f"the unpatched module failed beside them ({_death(rc)})"
        a, b = np.load(got), np.load(ref)
        if info.get("kernel_amx"):
            # the AMX kernel takes the 6- and 40-row batches' Q4_K rows, each with the gemv's integers and float
            # steps: the same logits bit for bit as the module's VNNI kernels give with it off
            rc, tail = _run_child("fast", model, {**env, "GGML_SMALLBATCH_AMX": "0"}, str(ref))
            if rc != 0:
                return f"with their AMX forms off they failed ({_death(rc)})"
            if (amx := float(np.max(np.abs(a - np.load(ref))))) != 0.0:
                return f"their AMX forms' logits differ from their VNNI forms' by up to {amx:.3g}"
    n = sum(BATCHES)
    # with their F16 kernel (attention) a batch's rows get the logits of decoding its tokens one
    # at a time; without it (no AVX2) llamafile's sgemm sums attention as the unpatched module does
    want = b[n:] if info.get("kernel_f16") else b[:PER_ROW]
    diff = max(float(np.max(np.abs(a[:PER_ROW] - want))), float(np.max(np.abs(a[n:] - b[n:]))))
    if diff != 0.0:
        return f"their logits differ from the per-row kernels' by up to {diff:.3g}"
    if (moved := float(np.max(np.abs(softmax(a[PER_ROW:n]) - softmax(b[PER_ROW:n]))))) > PROB_TOLERANCE:
        return f"a token's probability differs from the unpatched module's by {moved:.2f}"
    return None


def prove_kernels(directory: Path, manifest: dict, sig: str) -> bool:
    """Does the small-batch build of fast mode's variant run here and give the unpatched module's
    logits bit for bit? Records the variant as rejected for this CPU when not."""
    from edgespec.models import bundled_path

    entry = manifest.setdefault("checked", {}).setdefault(sig, {}).setdefault("kernels", {})
    entry["crashed"] = []
    variant = manifest.get("checked", {}).get(sig, {}).get("fast", {}).get("variant")
    if variant is None or variant not in backend.cpu_modules(directory):
        _say(f"no small-batch kernels for this CPU's {variant or 'unknown'} variant in {directory}; "
             "the unpatched kernels run")
        return False
    env = {"EDGESPEC_CPU_VARIANT": variant, "EDGESPEC_KERNEL_MODULES": str(directory)}
    for name in KERNEL_MODELS:
        if (why := _compare_kernels(str(bundled_path(name)), env)) is not None:
            why = f"{name}: {why}"
            break
    if why is not None:
        entry["crashed"] = [variant]
        _say(f"the small-batch {variant} kernels are not used on this CPU ({why}); the unpatched kernels run")
        return False
    entry["variant"] = variant
    _say(f"small-batch {variant} kernels run here and match the unpatched kernels")
    return True


def prove(mode: str, directory: Path, model_path: str, manifest: dict, sig: str) -> bool:
    """Try this mode's kernel variants, best first, until one runs; record what happened."""
    env = {"EDGESPEC_EXACT_MODULES": str(directory)} if mode == "exact" else {}
    entry = manifest.setdefault("checked", {}).setdefault(sig, {}).setdefault(mode, {})
    entry["crashed"] = []
    entry["cpu"] = backend.this_cpu().model
    ranked = backend.ranked_variants(directory, sig, mode, {})
    if not backend.cpu_modules(directory):
        ranked = [("built-in", directory, 1)]
    label = "exact-mode " if mode == "exact" else ""
    for name, _, _ in ranked:
        variant_env = {} if name == "built-in" else {**env, "EDGESPEC_CPU_VARIANT": name}
        # fast mode proves the unpatched modules (prove_kernels checks the small-batch ones)
        rc, tail = _run_child(mode, model_path, {**variant_env, "EDGESPEC_KERNELS": "stock"})
        if rc == 0:
            entry["variant"] = name
            _say(f"{label}llama.cpp runs here with the {name} CPU kernels")
            return True
        why = _death(rc) + (f": {tail}" if tail and rc > 0 else "")
        _say(f"the {label}{name} CPU kernels do not run on this CPU ({why}); trying the next")
        entry["crashed"].append(name)
    entry.pop("variant", None)
    _say(f"no {label}CPU kernel variant runs on this CPU")
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.apps.buildcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--cmake-args", default=None, help="the flags the library was built with (recorded)")
    ap.add_argument("--exact-modules", default=None, help="folder of the llamafile-off CPU modules")
    ap.add_argument("--kernel-modules", default=None,
                    help="folder of the small-batch CPU modules ('' when they could not be built)")
    ap.add_argument("--gpu-modules", default=None,
                    help="folder of the GPU backend module to prove ('' when it could not be built)")
    ap.add_argument("--variant", action="store_true",
                    help="print the CPU variant fast mode was proved with on this CPU, and exit")
    ap.add_argument("--model", default=None, help="GGUF to test with (default: the bundled SmolLM2)")
    ap.add_argument("--logits-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true", help="check, but record nothing beside the library")
    ap.add_argument("--child", choices=["fast", "exact", "gpu"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.model is None:
        from edgespec.models import bundled_path

        args.model = str(bundled_path("smollm2-135m"))
    if args.child == "gpu":
        return run_command(lambda: gpu_child(args.model))
    if args.child:
        return run_command(lambda: child(args.child, args.model, args.logits_out))

    try:
        lib = backend.lib_dir()
    except EdgeSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Scoring a module needs libggml-base in the process (the modules link to it by name); it holds
    # no CPU-specific kernels, so loading it here is safe on any processor.
    base = backend.shared_lib(lib, "ggml-base")
    if base is not None:
        ctypes.CDLL(str(base), mode=getattr(os, "RTLD_GLOBAL", 0))
    manifest = backend.read_manifest(lib)
    if args.variant:
        variant = manifest.get("checked", {}).get(backend.this_cpu().signature, {}).get("fast", {}).get("variant")
        print(variant or "")
        return 0 if variant else 1
    version = importlib.metadata.version("llama_cpp_python")
    if args.cmake_args is not None and (manifest.get("cmake_args"), manifest.get("llama_cpp_python")) != (
        args.cmake_args, version
    ):
        manifest = {}  # another build: what was checked before says nothing about this one
    cpu = backend.this_cpu()
    manifest["llama_cpp_python"] = version
    if args.cmake_args is not None:
        manifest["cmake_args"] = args.cmake_args
        manifest["built_on"] = {"cpu": cpu.model, "flags": sorted(cpu.flags & backend.ISA_FLAGS)}
    if args.exact_modules is not None:
        manifest["exact_modules"] = str(Path(args.exact_modules).resolve())
    if args.kernel_modules is not None:
        if args.kernel_modules:
            manifest["kernel_modules"] = str(Path(args.kernel_modules).resolve())
        else:
            manifest.pop("kernel_modules", None)
    modes = [("fast", lib)]
    if manifest.get("exact_modules"):
        modes.append(("exact", Path(manifest["exact_modules"])))
    ok = True
    for mode, directory in modes:
        ok = prove(mode, directory, args.model, manifest, cpu.signature) and ok
    if ok and args.kernel_modules:  # the set-up names them once they are built for this variant
        prove_kernels(Path(manifest["kernel_modules"]), manifest, cpu.signature)
    if ok and args.gpu_modules is not None:
        prove_gpu(Path(args.gpu_modules) if args.gpu_modules else None, manifest, args.model)
    if args.dry_run:
        return 0 if ok else 1
    try:
        backend.write_manifest(lib, manifest)
    except OSError as exc:
        _say(f"could not record the check beside the library ({exc}); it will be repeated next time")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
