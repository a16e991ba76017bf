"""Which llama.cpp kernels run: the CPU backend variant for this processor, and the exact-mode set.

The set-up builds llama-cpp-python with `GGML_BACKEND_DL` and `GGML_CPU_ALL_VARIANTS`, the way
llama.cpp's own release builds ship: the CPU kernels are separate modules (libggml-cpu-haswell.so,
-zen4, -x64, ...), each compiled for one instruction-set level, and the best one this processor
supports is loaded at start-up. One build then runs on any x86-64 CPU.

llama.cpp would search for those modules in the Python executable's folder and the working
directory, not beside the library, so EdgeSpec chooses and loads the module itself, before
`llama_backend_init`:

* a module's own `ggml_backend_score()` says whether this CPU can run it (0: no) and how well;
* variants with AMX kernels are skipped (the AMX path segfaults on the Xeons we run on, NOTES);
* a variant the set-up's build check saw crash on this CPU is skipped;
* exact mode loads the same variant from the llamafile-off module set (made by the set-up), so
  fast and exact mode share one libllama and differ only in their matrix kernels;
* fast mode loads that variant from the small-batch kernel set when the set-up built and proved
  one for this CPU (native/smallbatch: one pass over the weights for 2-8 activation rows, so a
  verification pass of a few tokens costs little more than one token); `EDGESPEC_KERNELS=stock`
  runs the unpatched modules instead, and the unpatched set is what runs when the patched one is
  missing or failed the set-up's check.

GPU backends are loadable modules too (libggml-vulkan.so, libggml-cuda.so): the set-up builds the
one this machine can use from the same source, proves it (a greedy speculative run on the device
equals plain decoding there) and records its folder; `load` then loads it beside the CPU kernels,
and `devices()` lists what llama.cpp can run a model on (`choose_device` picks one: a GPU where one
is there, else the CPU).

A build without loadable modules (a CUDA/Metal build made with other `EDGESPEC_CMAKE_ARGS`, or a
plain `pip install llama-cpp-python`) has its CPU kernels linked in; then the instruction sets it
was compiled for (llama.cpp's system info) are checked against this CPU's, and a mismatch is a
one-line error instead of "Illegal instruction" on the first decode.

The set-up writes `edgespec-build.json` beside the library: the flags, the CPU it was built on,
where the exact-mode modules are, and what the build check found per CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError

MANIFEST = "edgespec-build.json"
# Variants compiled with AMX tile instructions; ggml's AMX matmul crashed on the Xeons (NOTES).
AMX_VARIANTS = frozenset({"sapphirerapids"})
GPU_KINDS = ("cuda", "vulkan")  # GPU backend modules the set-up builds (libggml-<kind>.so)
# llama.cpp's system-info feature names -> the /proc/cpuinfo flags the compiled code needs.
# GGML_AVX512 compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw.
FEATURE_FLAGS: dict[str, tuple[str, ...]] = {
    "SSE3": ("pni",), "SSSE3": ("ssse3",), "AVX": ("avx",), "AVX2": ("avx2",), "F16C": ("f16c",),
    "FMA": ("fma",), "BMI2": ("bmi2",), "AVX_VNNI": ("avx_vnni",),
    "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "AVX512_VBMI": ("avx512vbmi",), "AVX512_VNNI": ("avx512_vnni",), "AVX512_BF16": ("avx512_bf16",),
    "AMX_INT8": ("amx_int8",),
}
# CPU flags that decide which kernels can run; a native build may use any of them.
ISA_FLAGS = frozenset(f for fs in FEATURE_FLAGS.values() for f in fs) | {
    "sse4_1", "sse4_2", "avx512ifma", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_fp16",
    "amx_tile", "amx_bf16", "gfni", "vaes", "vpclmulqdq",
}


@dataclass(frozen=True)
class Cpu:
    model: str
    flags: frozenset[str]

    @property
    def signature(self) -> str:
        """Short id of what decides which kernels run and how fast: model name and ISA flags."""
        isa = sorted(self.flags & ISA_FLAGS)
        return hashlib.sha256(json.dumps([self.model, isa]).encode()).hexdigest()[:16]


def this_cpu() -> Cpu:
    """Model name and feature flags of this processor (Linux /proc/cpuinfo; elsewhere the machine name)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return Cpu(platform.processor() or platform.machine(), frozenset())
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = val.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(val.split())
        if model and flags:
            break
    return Cpu(model or platform.machine(), flags)


@dataclass
class Backend:
    """What was loaded: for the profile key, the stats and error messages."""

    mode: str  # 'fast' | 'exact'
    variant: str  # CPU module variant ('haswell', 'zen4', ...) or 'built-in'
    module: str | None  # path of the loaded CPU module
    others: list[str] = field(default_factory=list)  # GPU/accelerator backends loaded beside it
    cpu: Cpu = field(default_factory=this_cpu)
    kernels: str = "stock"  # 'smallbatch' when the small-batch kernels run (their module, GGML_CPU_SMALLBATCH not off)
    # vector width in bits of the small-batch kernels that run: 512 where the module has 512-bit forms
    # and the CPU takes them (AMD Zen 4 and later, Intel Xeons with AMX, or GGML_SMALLBATCH_512 says so), else 256; None for stock
    kernel_bits: int | None = None
    # where the small-batch kernels prefetch their weights when they take several rows: 'L2' (AMD Zen 4,
    # or GGML_SMALLBATCH_PREFETCH_L2 says so) or 'L1'; None for stock
    kernel_prefetch: str | None = None
    # whether they include the F16 kernel that gives attention in a verification pass vec_dot's sums, so
    # each row gets the logits it gets decoded alone (AVX2 and later; SMALLBATCH_F16); None for stock
    kernel_f16: bool | None = None
    # whether they take their Intel AMX forms (tile multiplies for repacked Q4_K from 6 rows a call: Sapphire
    # Rapids and later Xeons, unless GGML_SMALLBATCH_AMX says no); None for stock
    kernel_amx: bool | None = None

    def to_dict(self) -> dict:
        return {"mode": self.mode, "cpu_variant": self.variant, "kernels": self.kernels,
                "kernel_bits": self.kernel_bits, "kernel_prefetch": self.kernel_prefetch, "kernel_f16": self.kernel_f16,
                "kernel_amx": self.kernel_amx, "gpu_backends": self.others, "cpu": self.cpu.model}


def lib_dir() -> Path:
    """llama_cpp's lib folder, found without importing llama_cpp (importing it loads the library)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise EdgeSpecError("llama-cpp-python is not installed; run scripts/setup.sh")
    return Path(list(spec.submodule_search_locations)[0]).resolve() / "lib"


def read_manifest(directory: Path) -> dict:
    return read_json(directory / MANIFEST)


def read_json(path: Path) -> dict:
    """A JSON object from a file; {} when it is missing or not one."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_manifest(directory: Path, data: dict) -> None:
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(directory / MANIFEST)


def _suffix() -> str:
    return {"win32": ".dll", "darwin": ".so"}.get(sys.platform, ".so")


def _prefix() -> str:
    return "" if sys.platform == "win32" else "lib"


def cpu_modules(directory: Path) -> dict[str, Path]:
    """Variant name -> module file of the CPU backend modules in `directory`."""
    head = f"{_prefix()}ggml-cpu-"
    return {
        p.name[len(head) : -len(_suffix())]: p
        for p in sorted(directory.glob(f"{head}*{_suffix()}"))
        if p.is_file()
    }


def module_score(path: Path) -> int:
    """The module's own verdict on this CPU: 0 = cannot run here, higher = better match."""
    handle = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL if hasattr(os, "RTLD_LOCAL") else 0)
    try:
        fn = getattr(handle, "ggml_backend_score", None)
        if fn is None:
            return 1  # a module without a score makes no claim; usable as a last resort
        fn.restype = ctypes.c_int
        return int(fn())
    finally:
        _dlclose(handle)


def _dlclose(handle: ctypes.CDLL) -> None:
    import _ctypes

    closer = getattr(_ctypes, "dlclose", None) or getattr(_ctypes, "FreeLibrary", None)
    if closer is not None:
        closer(handle._handle)


def ranked_variants(directory: Path, cpu_sig: str, mode: str, manifest: dict) -> list[tuple[str, Path, int]]:
    """(variant, path, score) of the modules this CPU may run, best first, leaving out AMX variants
    and variants the build check saw crash here."""
    crashed = set(manifest.get("checked", {}).get(cpu_sig, {}).get(mode, {}).get("crashed", []))
    out = []
    for name, path in cpu_modules(directory).items():
        if name in AMX_VARIANTS or name in crashed:
            continue
        score = module_score(path)
        if score > 0:
            out.append((name, path, score))
    return sorted(out, key=lambda t: -t[2])


def shared_lib(directory: Path, stem: str) -> Path | None:
    """The file of library `stem` (e.g. 'ggml') that others load by its soname. Wheels cannot hold
    symlinks, so libggml.so, libggml.so.0 and libggml.so.0.25.3 are three copies; opening the
    wrong one would give a second, separate backend registry."""
    plain = directory / f"{_prefix()}{stem}{_suffix()}"
    versioned = sorted(p for p in directory.glob(f"{plain.name}.*") if p.name[len(plain.name) + 1 :].isdigit())
    for p in (*versioned, plain, directory / f"{_prefix()}{stem}.dylib", directory / f"{stem}.dll"):
        if p.is_file():
            return p
    return None


def _ggml() -> ctypes.CDLL:
    d = lib_dir()
    path = shared_lib(d, "ggml")
    if path is None:
        raise EdgeSpecError(f"llama.cpp's ggml library is missing from {d}; re-run scripts/setup.sh")
    lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_GLOBAL", 0))
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_load.restype = ctypes.c_void_p
    lib.ggml_backend_load.argtypes = [ctypes.c_char_p]
    return lib


def _recorded_dir(variable: str, key: str) -> Path | None:
    """The folder the environment variable `variable` names, else the one the set-up recorded under `key`."""
    if (folder := env.path(variable)) is not None:
        return folder
    rec = read_manifest(lib_dir()).get(key)
    return Path(rec) if rec else None


def exact_dir() -> Path | None:
    """Folder of the llamafile-off CPU modules (exact mode): EDGESPEC_EXACT_MODULES, else the set-up's."""
    return _recorded_dir("EDGESPEC_EXACT_MODULES", "exact_modules")


def kernels_dir() -> Path | None:
    """Folder of the small-batch kernel modules (fast mode): EDGESPEC_KERNEL_MODULES, else the
    set-up's; None when `EDGESPEC_KERNELS=stock` asks for the unpatched modules."""
    if env.kernels() == "stock":
        return None
    return _recorded_dir("EDGESPEC_KERNEL_MODULES", "kernel_modules")


def _kernel_module(variant: str, cpu_sig: str, manifest: dict) -> Path | None:
    """The small-batch build of CPU variant `variant`, when there is one that the set-up's check
    did not reject on this CPU."""
    d = kernels_dir()
    if d is None:
        return None
    # a folder named in the environment is taken as it is (the build check's own way to test it)
    rejected = set() if env.text("EDGESPEC_KERNEL_MODULES") else set(
        manifest.get("checked", {}).get(cpu_sig, {}).get("kernels", {}).get("crashed", []))
    path = cpu_modules(d).get(variant)
    return path if path is not None and variant not in rejected else None


def exact_available() -> bool:
    try:
        d = exact_dir()
    except EdgeSpecError:
        return False
    return d is not None and bool(cpu_modules(d))


def load(llama: ModuleType, mode: str = "fast") -> Backend:
    """Register llama.cpp's backends for this process (once, before `llama_backend_init`)."""
    ggml = _ggml()
    base = lib_dir()
    cpu = this_cpu()
    manifest = read_manifest(base)
    if ggml.ggml_backend_reg_count() > 0 or not cpu_modules(base):
        # CPU kernels linked into the library: they are what they were compiled for.
        if mode == "exact":
            raise EdgeSpecError(
                "exact mode needs the set-up's llama.cpp build (CPU kernels as loadable modules); "
                "this library has them built in: run scripts/setup.sh"
            )
        check_builtin_features(llama.llama_print_system_info().decode(), cpu, manifest)
        return Backend(mode, "built-in", None, cpu=cpu)
    directory = base
    if mode == "exact":
        directory = exact_dir() or Path("/nonexistent")
        if not cpu_modules(directory):
            raise EdgeSpecError(
                f"exact-mode kernels not found in {directory}; run scripts/setup.sh (without EDGESPEC_EXACT_LIB=0)"
            )
    forced = env.text("EDGESPEC_CPU_VARIANT")
    unchecked = env.flag("EDGESPEC_CPU_VARIANT_UNCHECKED")
    if forced:
        mods = cpu_modules(directory)
        if forced not in mods:
            raise EdgeSpecError(f"EDGESPEC_CPU_VARIANT={forced}: no such module; have {', '.join(mods)}")
        # EDGESPEC_CPU_VARIANT_UNCHECKED=1 loads it anyway: the build check's own test of crash detection.
        if module_score(mods[forced]) == 0 and not unchecked:
            raise EdgeSpecError(f"EDGESPEC_CPU_VARIANT={forced}: this CPU ({cpu.model}) cannot run it")
        choice = (forced, mods[forced])
    else:
        ranked = ranked_variants(directory, cpu.signature, mode, manifest)
        if not ranked:
            raise EdgeSpecError(
                f"no llama.cpp CPU kernels in {directory} run on this CPU ({cpu.model}); re-run scripts/setup.sh"
            )
        choice = ranked[0][:2]
    kernels = "stock"
    switch = env.normalize_smallbatch_switch()  # GGML_CPU_SMALLBATCH=0 runs the patched module unpatched
    env.normalize_smallbatch_flags()  # GGML_SMALLBATCH_512 and _PREFETCH_L2: their 512-bit forms, their prefetch level
    if mode == "fast" and (patched := _kernel_module(choice[0], cpu.signature, manifest)) is not None:
        choice, kernels = (choice[0], patched), "smallbatch" if switch else "stock"
    if forced and unchecked:
        _register_unchecked(ggml, choice[1])
    elif not ggml.ggml_backend_load(str(choice[1]).encode()):
        raise EdgeSpecError(f"llama.cpp could not load its CPU kernels from {choice[1]}")
    others = []
    gpu = gpu_dir()
    for path in sorted([*base.glob(f"{_prefix()}ggml-*{_suffix()}"), *gpu_modules(gpu)]):
        kind = path.name[len(_prefix()) + 5 : -len(_suffix())]
        if kind in ("base", "cpu") or kind.startswith("cpu-") or kind in others:
            continue
        if ggml.ggml_backend_load(str(path).encode()):
            others.append(kind)
    return Backend(mode, choice[0], str(choice[1]), others, cpu, kernels)


def gpu_dir() -> Path | None:
    """Folder of the GPU backend module the set-up built and proved (libggml-vulkan.so or
    libggml-cuda.so): EDGESPEC_GPU_MODULES, else the set-up's record; None when there is none."""
    return _recorded_dir("EDGESPEC_GPU_MODULES", "gpu_modules")


def gpu_modules(directory: Path | None) -> list[Path]:
    """The GPU backend modules in `directory` (none for None or a folder without them)."""
    if directory is None:
        return []
    return sorted(p for kind in GPU_KINDS for p in directory.glob(f"{_prefix()}ggml-{kind}{_suffix()}") if p.is_file())


_unchecked: list[ctypes.CDLL] = []  # modules registered past their score check (kept loaded)


def _register_unchecked(ggml: ctypes.CDLL, path: Path) -> None:
    """Register a CPU module without asking whether this CPU can run it (ggml_backend_load would
    refuse): only for the build check's test that a crashing variant is caught."""
    mod = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_GLOBAL", 0))
    mod.ggml_backend_init.restype = ctypes.c_void_p
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_register(mod.ggml_backend_init())
    _unchecked.append(mod)


def kernel_bits(kernels: str, system_info: str) -> int | None:
    """The small-batch kernels' vector width, as the loaded CPU module reports it in llama.cpp's
    feature string (SMALLBATCH_512 = 1: their 512-bit forms); None when they do not run."""
    if kernels != "smallbatch":
        return None
    return 512 if features(system_info).get("SMALLBATCH_512") == "1" else 256


def kernel_f16(kernels: str, system_info: str) -> bool | None:
    """Whether the small-batch kernels' F16 kernel runs (attention with vec_dot's sums from 2 rows on), as the
    loaded CPU module reports it (SMALLBATCH_F16 = 1); None when the small-batch kernels do not run."""
    return _module_flag(kernels, system_info, "SMALLBATCH_F16")


def kernel_amx(kernels: str, system_info: str) -> bool | None:
    """Whether the small-batch kernels take their AMX forms, as the loaded CPU module reports it
    (SMALLBATCH_AMX = 1); None when they do not run."""
    return _module_flag(kernels, system_info, "SMALLBATCH_AMX")


def _module_flag(kernels: str, system_info: str, name: str) -> bool | None:
    """Whether the loaded small-batch module lists feature `name` as 1; None when its kernels do not run."""
    if kernels != "smallbatch":
        return None
    return features(system_info).get(name) == "1"


def kernel_prefetch(kernels: str, system_info: str) -> str | None:
    """Where the small-batch kernels prefetch their weight stream when they take several rows, as the
    loaded CPU module reports it (SMALLBATCH_PREFETCH_L2 = 1: 'L2', else 'L1'); None when they do not run."""
    if kernels != "smallbatch":
        return None
    return "L2" if features(system_info).get("SMALLBATCH_PREFETCH_L2") == "1" else "L1"


def features(system_info: str) -> dict[str, str]:
    """llama.cpp's feature string ('AVX2 = 1 | LLAMAFILE = 1 | ...') as name -> value."""
    return {name.strip(): val.strip() for name, _, val in (p.partition(" = ") for p in system_info.split("|"))}


def check_builtin_features(system_info: str, cpu: Cpu, manifest: dict) -> None:
    """Refuse a library whose compiled-in kernels need instructions this CPU lacks."""
    if not cpu.flags:
        return  # no /proc/cpuinfo: nothing to compare against
    missing: set[str] = set()
    for name, val in features(system_info).items():
        if val == "1" and name in FEATURE_FLAGS:
            missing |= {f for f in FEATURE_FLAGS[name] if f not in cpu.flags}
    built_on = manifest.get("built_on") or {}
    if manifest and "GGML_NATIVE=OFF" not in manifest.get("cmake_args", "").upper():
        # -march=native may use any instruction of the build machine, listed or not.
        missing |= (set(built_on.get("flags", [])) & ISA_FLAGS) - cpu.flags
    if missing:
        raise EdgeSpecError(
            f"this llama.cpp build uses instructions this CPU ({cpu.model}) lacks "
            f"({', '.join(sorted(missing))}); it was built for {built_on.get('cpu', 'another processor')}: "
            "re-run scripts/setup.sh on this machine"
        )


# ----------------------------------------------------------------------------- RPC (other machines)
# llama.cpp's RPC backend is one more loadable module (libggml-rpc.so), built by the set-up from the
# same source against this library, next to llama.cpp's `rpc-server` program (README, "More than
# one machine"). Its folder is recorded in the manifest; RPC_INFO inside says what it was built for.
RPC_INFO = "edgespec-rpc.json"
RPC_PROGRAM = "ggml-rpc-server"


def rpc_dir() -> Path | None:
    """Folder of the RPC module and server program: EDGESPEC_RPC_DIR, else what the set-up recorded."""
    return _recorded_dir("EDGESPEC_RPC_DIR", "rpc")


def ggml_version() -> str:
    """Version of the installed ggml (the ABI an RPC module must have been built against)."""
    ggml = _ggml()
    ggml.ggml_version.restype = ctypes.c_char_p
    return ggml.ggml_version().decode()


def rpc_module(llama_version: str) -> Path:
    """The RPC backend module, checked: it and the server program are there and were built from the
    source of the installed llama-cpp-python (`llama_version`) against its ggml; otherwise a one-line
    error saying how to get them."""
    d = rpc_dir()
    if d is None or not (d / f"{_prefix()}ggml-rpc{_suffix()}").is_file() or not (d / RPC_PROGRAM).is_file():
        raise EdgeSpecError("llama.cpp's RPC backend is not built here: re-run scripts/setup.sh (it builds it in "
                            "about a minute; its log says why when it could not)")
    info = read_json(d / RPC_INFO)
    for what, version in (("llama-cpp-python", llama_version), ("ggml", ggml_version())):
        if info.get(what) != version:
            raise EdgeSpecError(f"the RPC backend in {d} was built for {what} {info.get(what)}, this one is "
                                f"{version}: re-run scripts/setup.sh")
    return d / f"{_prefix()}ggml-rpc{_suffix()}"


def server_modules(directory: Path, cpu_sig: str, manifest: dict) -> list[Path]:
    """The backend modules in `directory` an rpc-server on this machine may load: GPU/accelerator
    modules and the CPU variants, less the AMX ones and those the build check saw crash here. The
    server then picks the best-scoring CPU variant itself, which is the one `load` picks."""
    crashed = set(manifest.get("checked", {}).get(cpu_sig, {}).get("fast", {}).get("crashed", []))
    cpu = {p for name, p in cpu_modules(directory).items() if name not in AMX_VARIANTS | crashed}
    others = [p for p in directory.glob(f"{_prefix()}ggml-*{_suffix()}")
              if p.is_file() and p.name[len(_prefix()) + 5 : -len(_suffix())] not in ("base", "cpu")
              and not p.name.startswith(f"{_prefix()}ggml-cpu-")]
    return sorted(cpu | set(others))


@dataclass(frozen=True)
class RpcDevice:
    handle: int  # ggml_backend_dev_t
    endpoint: str
    description: str
    free: int  # bytes
    total: int


_rpc_reg: int | None = None


def rpc_devices(module: Path, endpoint: str) -> list[RpcDevice]:
    """Connect to the rpc-server at HOST:PORT through llama.cpp's RPC backend (loaded on first use)
    and return its devices. llama.cpp aborts the process when the server cannot be reached or speaks
    another protocol version, so only a process that may die calls this (edgespec.runtime.rpc's worker)."""
    global _rpc_reg
    ggml = _ggml()
    if _rpc_reg is None:
        reg = ggml.ggml_backend_load(str(module).encode())
        if not reg:
            raise EdgeSpecError(f"llama.cpp could not load its RPC backend from {module}: re-run scripts/setup.sh")
        _rpc_reg = reg
    ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    ggml.ggml_backend_dev_description.restype = ctypes.c_char_p
    ggml.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.POINTER(ctypes.c_size_t)]
    # ggml-rpc.h: ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint)
    addr = ggml.ggml_backend_reg_get_proc_address(_rpc_reg, b"ggml_backend_rpc_add_server")
    if not addr:
        raise EdgeSpecError("this RPC backend has no ggml_backend_rpc_add_server: re-run scripts/setup.sh")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(addr)
    server = add_server(endpoint.encode())
    if not server:
        raise EdgeSpecError(f"the RPC server at {endpoint} offers no devices")
    out = []
    for i in range(ggml.ggml_backend_reg_dev_count(server)):
        dev = ggml.ggml_backend_reg_dev_get(server, i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(RpcDevice(dev, endpoint, ggml.ggml_backend_dev_description(dev).decode(), free.value, total.value))
    return out


_ggml_log_hook: list[object] = []  # the installed callback, kept alive


def ggml_errors_to_stderr() -> None:
    """Write ggml's own warnings and errors (the RPC client's among them: "RPC server version
    mismatch: ...") to stderr as they come; llama.cpp's log stays captured by the runtime. For a
    process that llama.cpp may abort, whose stderr its parent reads afterwards."""
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

    def hook(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if level in (3, 4) and text:  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
            os.write(2, text)

    cb = proto(hook)
    ggml = _ggml()
    ggml.ggml_log_set.argtypes = [proto, ctypes.c_void_p]
    ggml.ggml_log_set(cb, None)
    _ggml_log_hook[:] = [cb]


# ----------------------------------------------------------------------------- devices
# What a model can run on: llama.cpp's registry of devices (the CPU, and one per GPU that a loaded
# GPU module found). ggml-vulkan leaves out CPU-type Vulkan devices (Mesa's lavapipe) unless
# GGML_VK_VISIBLE_DEVICES names them, so a machine without a GPU runs on its CPU by default even
# where the Vulkan module is installed.
CPU_DEVICE = "cpu"  # the name users give the CPU (llama.cpp calls it "CPU")
# ggml_backend_dev_type: CPU, GPU (dedicated memory), IGPU (host memory), ACCEL (beside the CPU), META
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel", "meta")


@dataclass(frozen=True)
class Device:
    name: str  # llama.cpp's device name ('Vulkan0', 'CUDA0'), or 'cpu'
    description: str  # 'NVIDIA H100 80GB HBM3', 'llvmpipe (LLVM 15.0.6, 256 bits)', the CPU's model
    kind: str  # one of DEVICE_TYPES
    free: int  # bytes of memory free on it
    total: int
    handle: int | None  # ggml_backend_dev_t; None for the CPU (a model then names no device)

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("gpu", "igpu")

    def line(self) -> str:
        """One line for `--list-devices`: name, description, memory."""
        memory = f"{self.free / 2**30:.1f} GiB free of {self.total / 2**30:.1f} GiB" if self.total else "memory unknown"
        return f"{self.name:<10} {self.description} ({self.kind}, {memory})"


def is_software(description: str) -> bool:
    """A GPU device that is the CPU running Mesa's software Vulkan driver (lavapipe: 'llvmpipe (LLVM
    15.0.6, 256 bits)'), as in CI and on machines without a GPU."""
    return description.lower().startswith("llvmpipe")


def _dev_api(ggml: ctypes.CDLL) -> ctypes.CDLL:
    """ggml's device functions with their C types (ggml-backend.h)."""
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (ggml.ggml_backend_dev_name, ggml.ggml_backend_dev_description):
        fn.restype = ctypes.c_char_p
        fn.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.POINTER(ctypes.c_size_t)]
    return ggml


def devices() -> list[Device]:
    """The devices llama.cpp has registered in this process (after `load`): the CPU first, then the
    GPUs and accelerators in llama.cpp's order. RPC servers' devices are left out (--rpc names them)."""
    ggml = _dev_api(_ggml())
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        name = ggml.ggml_backend_dev_name(dev).decode()
        kind = ggml.ggml_backend_dev_type(dev)
        kind = DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else str(kind)
        if name.startswith("RPC") or kind == "meta":
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        desc = ggml.ggml_backend_dev_description(dev).decode()
        if kind == "cpu":
            out.append(Device(CPU_DEVICE, desc, kind, free.value, total.value, None))
        else:
            out.append(Device(name, desc, kind, free.value, total.value, dev))
    out.sort(key=lambda d: d.kind != "cpu")
    return out


def choose_device(name: str | None) -> Device:
    """The device `name` names (case does not matter), or, for None, the default: the first GPU
    llama.cpp found, else the CPU. An unknown name is a one-line error listing the devices."""
    found = devices()
    if name is None:
        return next((d for d in found if d.is_gpu), next(d for d in found if d.kind == "cpu"))
    for d in found:
        if d.name.lower() == name.strip().lower():
            return d
    listed = ", ".join(f"{d.name} ({d.description})" for d in found)
    hint = "" if any(d.is_gpu for d in found) else (
        "; no GPU module is loaded: scripts/setup.sh builds one (EDGESPEC_GPU=vulkan|cuda)"
        if not gpu_modules(gpu_dir()) else "")
    raise EdgeSpecError(f"no device {name!r} here; devices: {listed}{hint}")
