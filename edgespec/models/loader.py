"""Load a model that a user names (a .gguf path, a bundled or catalog name, hf:ORG/REPO) with the
runtime options of this process: context size, threads, flash attention, fast or exact kernels."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from edgespec.runtime import llama as runtime
from edgespec.runtime.backend import CPU_DEVICE
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.llama import DEFAULT_N_CTX, FlashAttn, Model

MIN_CTX = 256  # below this llama.cpp rounds the context up anyway (its minimum padding)


def check_threads(n_threads: int | None, name: str = "threads") -> None:
    """None (all cores) or 1 up to the cores this process may use, else a one-line error naming `name`."""
    if n_threads is not None and n_threads < 1:
        raise EdgeSpecError(f"{name} must be >= 1, got {n_threads}")
    cores = len(os.sched_getaffinity(0))
    if n_threads is not None and n_threads > cores:
        # more threads than cores only makes llama.cpp's threads wait for each other (it sat
        # silent for minutes with 1000 on 2 cores)
        raise EdgeSpecError(f"{name} must be at most {cores}, the cores this process may use; got {n_threads}")


@dataclass(frozen=True)
class RuntimeOptions:
    """How models are loaded. `exact` selects the llamafile-off kernels, flash attention off and
    no weight repacking: single-token and batched decoding then agree bit for bit on F16 and
    Q8_0/Q4_0/Q4_1 weights, and drafts are capped at the row counts probed to agree (README,
    "Exactness"). `rpc` lists llama.cpp rpc-servers (HOST:PORT) that hold the target's layers; a
    drafter's model loads with `local()`, on this machine. `device` names where target and draft
    layers run ('cpu', 'Vulkan0', 'CUDA0', ...; None: a GPU where one loads, else the CPU; exact
    mode: the CPU, whose kernels its guarantee is about)."""

    n_ctx: int = DEFAULT_N_CTX
    n_threads: int | None = None
    flash_attn: FlashAttn = "auto"
    exact: bool = False
    rpc: tuple[str, ...] = ()
    device: str | None = None

    def __post_init__(self) -> None:
        if self.n_ctx < MIN_CTX:
            raise EdgeSpecError(f"context size must be >= {MIN_CTX} tokens (llama.cpp's minimum), got {self.n_ctx}")
        check_threads(self.n_threads)
        if self.flash_attn not in ("auto", "on", "off"):
            raise EdgeSpecError(f"flash attention must be auto, on or off, got {self.flash_attn!r}")
        if self.exact and self.flash_attn == "on":
            raise EdgeSpecError("--exact turns flash attention off (its batched path changes the arithmetic); "
                                "drop --flash-attn on")
        if self.rpc:
            from edgespec.runtime.rpc import check_endpoints

            check_endpoints(self.rpc)
            if self.exact:
                raise EdgeSpecError("--exact cannot run with --rpc: the servers run their own kernels, not the "
                                    "exact-mode ones")
        if self.device is not None and not self.device.strip():
            raise EdgeSpecError("--device is empty; give a name from --list-devices (cpu, Vulkan0, CUDA0, ...)")
        if self.exact and self.device is not None and self.device.strip().lower() != CPU_DEVICE:
            raise EdgeSpecError(f"--exact runs on the CPU only (its guarantee is about the CPU's kernels); drop "
                                f"--device {self.device} or give --device cpu")

    def local(self) -> RuntimeOptions:
        """The same options for a model that runs on this machine (a draft model)."""
        return replace(self, rpc=())


def prepare_runtime(opts: RuntimeOptions) -> None:
    """Choose fast or exact kernels before the first model loads."""
    runtime.set_mode("exact" if opts.exact else "fast")
    if opts.exact and runtime.llamafile_enabled():
        raise EdgeSpecError("the exact-mode kernels were built with llamafile on; re-run scripts/setup.sh")


def load_model(
    name: str,
    opts: RuntimeOptions,
    progress: Callable[[float], None] | None = None,
    download_progress: Callable[[int, int], None] | None = None,
) -> Model:
    """Resolve `name` (downloading a catalog or hf: model if needed) and load it.
    progress(fraction) follows llama.cpp's loading; download_progress(done, total) a download."""
    from edgespec.models import resolve
    from edgespec.models.inspect import read_header

    prepare_runtime(opts)
    path = resolve(name, download_progress)
    # llama.cpp aborts the whole process (the UI and the server with it) on some damaged files;
    # the header is checked first, whatever the name resolved through
    read_header(path)
    if opts.rpc:
        from edgespec.runtime.rpc import RemoteModel

        return RemoteModel(path, opts.rpc, n_ctx=opts.n_ctx, flash_attn=opts.flash_attn, progress=progress)
    return Model(
        path,
        n_ctx=opts.n_ctx,
        n_threads=opts.n_threads,
        flash_attn="off" if opts.exact else opts.flash_attn,
        repack=not opts.exact,
        progress=progress,
        device=opts.device,
    )
