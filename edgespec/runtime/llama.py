"""Thin wrapper over llama_cpp's low-level C API.

One `Model` is one loaded GGUF file plus one context (KV cache) on sequence 0. It does exactly
what the speculative loop needs: tokenize, decode a batch with logits on its last rows, view those
logits without copying, and roll the KV cache back to a prefix.

`llama_cpp` is imported lazily, and the llama.cpp kernels for this processor (and for fast or
exact mode) are chosen by `edgespec.runtime.backend` before anything runs; `set_mode("exact")` must come
before the first model loads.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import queue
import re
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np

from edgespec.runtime import backend, env, threads
from edgespec.runtime.chat_template import chat_parts, render_chat_template
from edgespec.runtime.errors import EdgeSpecError
from edgespec.runtime.model_file import ModelFile

FlashAttn = Literal["auto", "on", "off"]
_FLASH = {"auto": -1, "off": 0, "on": 1}
GGUF_MAGIC = b"GGUF"

_lib: ModuleType | None = None
_mode = "fast"
_backend: backend.Backend | None = None
_log_tail: list[str] = []
_offloaded: list[str] = []  # llama.cpp's "offloaded N/M layers to GPU" line of the last load
# Ctrl-C raised inside a ctypes callback (llama.cpp's logging or load progress) would be printed
# and dropped by ctypes. So while llama.cpp runs (`_in_c` > 0) our SIGINT handler only notes it;
# the progress callback then aborts a load, and KeyboardInterrupt is raised once the C call returns.
_interrupted = False
_in_c = 0


# Context and batch size a model loads with unless told otherwise (the CLI, UI and server default
# to these through RuntimeOptions).
DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512


def _on_sigint(signum: int, frame: object) -> None:
    global _interrupted
    if _in_c:
        _interrupted = True
    else:
        raise KeyboardInterrupt


class _CCall:
    """`with _CCall():` around a llama.cpp call that may run Python callbacks."""

    def __enter__(self) -> None:
        global _in_c
        _in_c += 1

    def __exit__(self, *exc: object) -> None:
        global _in_c
        _in_c -= 1


class _ComputeThread:
    """The one thread of this process on which llama.cpp computes (`run`).

    ggml's CPU backend runs a pass's threads with OpenMP, and libgomp keeps a team of worker
    threads for every thread that starts parallel work. Once the teams' threads outnumber the
    cores, libgomp cuts each barrier's spin-wait to almost nothing (`gomp_throttled_spin_count_var`
    when `gomp_managed_threads > gomp_available_cpus`), so the hundreds of barriers of every pass sleep
    and wake in the kernel. A server's worker thread, a UI's generation threads and a main thread
    that decoded once are such threads: on 2 cores (AMD EPYC Zen 4), plain decoding of the 1.5B
    target ran at 21-23 tok/s from a second thread against 29-33 from one (docs/server.md). So
    every decode goes to this thread, started on first use; the caller waits for it (a hand-over
    costs tens of microseconds against a pass's tens of milliseconds)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def run(self, fn: Callable[..., int], *args: object) -> int:
        if threading.current_thread() is self._thread:
            return fn(*args)
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    th = threading.Thread(target=self._serve, name="edgespec-llama-compute", daemon=True)
                    th.start()
                    self._thread = th
        job = _Job(fn, args)
        self._jobs.put(job)
        job.done.acquire()  # a signal handler may run while this waits (it only notes Ctrl-C: _CCall)
        if job.error is not None:
            raise job.error
        return job.result

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.fn(*job.args)
            except BaseException as exc:  # handed back to the caller
                job.error = exc
            job.done.release()


class _Job:
    __slots__ = ("fn", "args", "done", "result", "error")

    def __init__(self, fn: Callable[..., int], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Lock()
        self.done.acquire()  # released by the compute thread when the call returns
        self.result: int = 0
        self.error: BaseException | None = None


_compute = _ComputeThread()


def set_mode(mode: str) -> None:
    """'fast' (default kernels) or 'exact' (llamafile-off kernels); before the first model loads."""
    global _mode
    if mode not in ("fast", "exact"):
        raise ValueError(f"mode must be 'fast' or 'exact', got {mode!r}")
    if _lib is not None and mode != _mode:
        raise EdgeSpecError(
            f"this process already runs llama.cpp in {_mode} mode; {mode} mode needs a new process"
        )
    _mode = mode


def resolve_flash_attn(flash_attn: FlashAttn, on_cpu: bool = True, software_gpu: bool = False) -> FlashAttn:
    """'auto' is 'off' where every layer runs on this machine's CPU: llama.cpp's CPU flash-attention
    path made verification passes slower at every row count measured (docs/kernels.md). It is 'off'
    on a software Vulkan device too (Mesa's llvmpipe, `backend.is_software`): Mesa 22.3.6's lavapipe
    dies in its queue thread (SIGSEGV) running ggml's flash-attention shader for some cache lengths
    (3 rows after 43 cached tokens of SmolLM2; docs/gpu.md). On GPU or RPC devices llama.cpp decides.
    'on' and 'off' are kept."""
    return "off" if flash_attn == "auto" and (on_cpu or software_gpu) else flash_attn


def mode() -> str:
    return _mode


def _check_interrupt() -> None:
    global _interrupted
    if _interrupted:
        _interrupted = False
        raise KeyboardInterrupt


def lib() -> ModuleType:
    """The llama_cpp module, imported on first use with llama.cpp's logging captured, not printed,
    and the CPU kernels for this processor loaded."""
    global _lib, _backend
    if _lib is None:
        try:
            import llama_cpp
        except ImportError as exc:
            from edgespec.runtime.firstrun import missing_llama_message

            raise EdgeSpecError(missing_llama_message(exc)) from None

        @llama_cpp.llama_log_callback
        def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            global _interrupted
            try:
                # Keep the last lines so a failed load can say why, without flooding the terminal.
                line = text.decode("utf-8", "replace")
                _log_tail.append(line)
                del _log_tail[:-20]
                if "offloaded " in line and " layers to GPU" in line:
                    _offloaded[:] = [line]
            except KeyboardInterrupt:
                _interrupted = True

        llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
        llama_cpp._edgespec_log_cb = _log  # keep the callback alive
        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            signal.signal(signal.SIGINT, _on_sigint)
        with _CCall():
            _backend = backend.load(llama_cpp, _mode)
            llama_cpp.llama_backend_init()
            system_info = llama_cpp.llama_print_system_info().decode()
            _backend.kernel_bits = backend.kernel_bits(_backend.kernels, system_info)
            _backend.kernel_prefetch = backend.kernel_prefetch(_backend.kernels, system_info)
            _backend.kernel_f16 = backend.kernel_f16(_backend.kernels, system_info)
            _backend.kernel_amx = backend.kernel_amx(_backend.kernels, system_info)
        _lib = llama_cpp
        _check_interrupt()
    return _lib


def backend_info() -> backend.Backend:
    """Which kernels this process runs (CPU variant, fast or exact, GPU backends)."""
    lib()
    assert _backend is not None
    return _backend


def system_info() -> str:
    """llama.cpp's feature string (e.g. 'AVX512 = 1 | LLAMAFILE = 1 | ...')."""
    return lib().llama_print_system_info().decode()


def llamafile_enabled() -> bool:
    return "LLAMAFILE = 1" in system_info()


def parameter_label(n_params: int) -> str:
    """A parameter count as model names give it: 134_515_008 -> '135M', 1_235_814_400 -> '1.2B'."""
    if n_params >= 999_500_000:
        return f"{n_params / 1e9:.1f}B"
    return f"{n_params / 1e6:.0f}M" if n_params >= 999_500 else f"{n_params / 1e3:.0f}K"


def _last_llama_error() -> str:
    lines = [ln.strip() for ln in _log_tail if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    return (errors or lines or ["no details from llama.cpp"])[-1]


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Raise a one-line error unless `path` is an existing file that starts like a GGUF."""
    p = Path(path).expanduser()
    if not p.exists():
        raise EdgeSpecError(f"model file not found: {p}")
    if not p.is_file():
        raise EdgeSpecError(f"not a file: {p}")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise EdgeSpecError(f"not a GGUF file (bad magic {magic!r}): {p}")
    return p


@dataclass(frozen=True)
class ModelInfo:
    path: str
    description: str
    n_params: int
    size_bytes: int
    n_vocab: int
    n_ctx_train: int
    vocab_type: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


class Model:
    """A GGUF model with one context. Positions and the KV cache are tracked on sequence 0.

    The model knows which tokens its cache holds: `cached` lists them in position order (every
    `decode` appends, `truncate(n)` and `reset` drop), `n_past` is their count, `decode` appends at
    `n_past`. `reuse(tokens)` keeps the longest cached prefix of `tokens` and drops the rest, so a
    new generation decodes only what follows it (prefix reuse across requests and chat turns).
    Code that decodes behind the model's back (straight llama_cpp calls) must `reset()` after.
    """

    rpc_servers: tuple[str, ...] = ()  # HOST:PORT of the rpc-servers holding the layers (edgespec.runtime.rpc)
    device: str = backend.CPU_DEVICE  # where the layers run: 'cpu', 'Vulkan0', 'CUDA0', ... ('rpc': rpc_servers)
    device_description: str = ""
    layers_on_device: str = "0"  # llama.cpp's count of layers offloaded to `device`, as "N/M"
    auto_threads: bool = False  # the thread count follows the free cores (runtime/threads.py)
    threads_now: int = 0  # CPU threads of the last pass

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_batch: int = DEFAULT_N_BATCH,
        n_threads: int | None = None,
        flash_attn: FlashAttn = "auto",
        repack: bool = True,
        progress: Callable[[float], None] | None = None,
        devices: Sequence[int] = (),
        device: str | None = None,
    ) -> None:
        p = check_gguf_file(path)
        llama = lib()
        self.path = str(p)
        self.file = ModelFile(p)
        self._load_weights(llama, p, repack, devices, device, progress)
        # no thread count given: every decode on the CPU uses the cores other processes leave free
        # (runtime/threads.py); exact mode keeps one count, as its cost profile was proved with it
        on_cpu = not devices and self.device == backend.CPU_DEVICE
        self.auto_threads = n_threads is None and _mode != "exact" and on_cpu
        n_threads = n_threads or max(1, len(os.sched_getaffinity(0)))
        flash_attn = resolve_flash_attn(flash_attn, on_cpu=on_cpu, software_gpu=backend.is_software(self.device_description))
        self._create_context(llama, p, n_ctx, n_batch, n_threads, flash_attn)
        self.n_ctx = llama.llama_n_ctx(self._ctx)
        # llama.cpp may shrink the batch (never above the requested context); decode must not exceed it.
        self.n_batch = min(n_batch, llama.llama_n_batch(self._ctx), llama.llama_n_ubatch(self._ctx))
        self.n_threads = n_threads
        self.threads_now = n_threads  # what the last pass used (below n_threads while other work holds cores)
        self.flash_attn = flash_attn
        self.repack = repack
        self._mem = llama.llama_get_memory(self._ctx)
        self._init_batch(llama, n_batch)
        self._cached: list[int] = []  # the tokens whose K/V are in the cache, by position
        self._pieces: dict[int, bytes] = {}
        self.n_embd = llama.llama_model_n_embd(self._model)
        self._embeddings_on = False

    def _load_weights(self, llama: ModuleType, p: Path, repack: bool, devices: Sequence[int], device: str | None,
                      progress: Callable[[float], None] | None) -> None:
        """Load the GGUF file into `_model` (and its vocabulary): every layer on `device` (a name
        from `backend.devices()`; None: the default, a GPU where one loads, else the CPU), as many
        as EDGESPEC_GPU_LAYERS says on a GPU; or every layer on `devices` (ggml_backend_dev_t handles
        of RPC servers). Ctrl-C aborts the load."""
        mparams = llama.llama_model_default_params()
        # Repacked (interleaved) weight layouts use other kernels; exact mode turns them off.
        mparams.use_extra_bufts = repack
        if devices:  # every layer goes to them
            handles, layers = list(devices), -1
            self.device, self.device_description = "rpc", "llama.cpp rpc-server"
        else:
            if _mode == "exact" and device is not None and device.strip().lower() != backend.CPU_DEVICE:
                raise EdgeSpecError(f"exact mode runs on the CPU only (its guarantee is about the CPU's kernels), "
                                    f"not on {device}")
            dev = backend.choose_device(backend.CPU_DEVICE if _mode == "exact" else device)
            self.device, self.device_description = dev.name, dev.description
            handles = [] if dev.handle is None else [dev.handle]
            layers = 0 if dev.handle is None else env.gpu_layers()
        # The model uses exactly these devices (NULL-terminated; empty: the CPU only), never
        # llama.cpp's default of every GPU it found.
        self._device_list = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
        mparams.devices = ctypes.cast(self._device_list, ctypes.c_void_p)
        mparams.n_gpu_layers = -1 if layers is None else layers
        _offloaded.clear()

        @llama.llama_progress_callback
        def _progress(fraction: float, user_data: ctypes.c_void_p) -> bool:
            global _interrupted
            try:
                if progress is not None and not _interrupted:
                    progress(float(fraction))
            except KeyboardInterrupt:
                _interrupted = True
            return not _interrupted  # False aborts the load

        mparams.progress_callback = _progress
        self._progress_cb = _progress
        with _CCall():
            self._model = llama.llama_model_load_from_file(self.path.encode(), mparams)
        if _interrupted:
            if self._model:
                llama.llama_model_free(self._model)
                self._model = None
            _check_interrupt()
        if not self._model:
            raise EdgeSpecError(f"llama.cpp could not load {p.name}: {_last_llama_error()}")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        # "load_tensors: offloaded 31/31 layers to GPU": what llama.cpp put on the device
        self.layers_on_device = _offloaded[0].split("offloaded ")[1].split(" ")[0] if _offloaded else "0"

    def _create_context(self, llama: ModuleType, p: Path, n_ctx: int, n_batch: int, n_threads: int,
                        flash_attn: FlashAttn) -> None:
        """The model's one context (`_ctx`, its KV cache); the model is freed if it cannot be made."""
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.flash_attn_type = _FLASH[flash_attn]
        # Per-token hidden states (for learned drafters) are switched on per decode call
        # (`decode(..., hidden=True)`); with no pooling they are the final norm's output rows.
        cparams.pooling_type = llama.LLAMA_POOLING_TYPE_NONE
        with _CCall():
            self._ctx = llama.llama_init_from_model(self._model, cparams)
        _check_interrupt()
        if not self._ctx:
            error = _last_llama_error()
            n_ctx_train = llama.llama_model_n_ctx_train(self._model)
            llama.llama_model_free(self._model)
            self._model = None
            # Nearly always the KV cache not fitting in memory: say which knob to turn.
            raise EdgeSpecError(f"llama.cpp could not create a {n_ctx}-token context for {p.name} ({error}); "
                                f"lower --ctx (the model was trained for {n_ctx_train} tokens)")

    def _init_batch(self, llama: ModuleType, n_batch: int) -> None:
        """The one llama_batch every decode fills, all rows on sequence 0."""
        self._batch = llama.llama_batch_init(n_batch, 0, 1)
        # numpy views over the batch arrays: filling them is a slice assignment, not a Python loop.
        self._b_token = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._b_pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._b_logits = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))[:] = 1
        for i in range(n_batch):
            self._batch.seq_id[i][0] = 0

    # ----------------------------------------------------------------------------- metadata
    @cached_property
    def info(self) -> ModelInfo:
        llama = lib()
        buf = ctypes.create_string_buffer(256)
        llama.llama_model_desc(self._model, buf, len(buf))
        n_params = llama.llama_model_n_params(self._model)
        # llama.cpp's description guesses the size from the layer count ("llama 256M" for the 135M
        # SmolLM2); say the counted size instead.
        parts = buf.value.decode("utf-8", "replace").split(" ")
        if len(parts) >= 3 and parts[1][:1].isdigit():
            parts[1] = parameter_label(n_params)
        return ModelInfo(
            path=self.path,
            description=" ".join(parts),
            n_params=n_params,
            size_bytes=llama.llama_model_size(self._model),
            n_vocab=self.n_vocab,
            n_ctx_train=llama.llama_model_n_ctx_train(self._model),
            vocab_type=llama.llama_vocab_type(self._vocab),
            bos=llama.llama_vocab_bos(self._vocab),
            eos=llama.llama_vocab_eos(self._vocab),
            add_bos=bool(llama.llama_vocab_get_add_bos(self._vocab)),
            add_eos=bool(llama.llama_vocab_get_add_eos(self._vocab)),
        )

    # ----------------------------------------------------------------------------- text
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (ctypes.c_int32 * cap)()
        n = lib().llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (ctypes.c_int32 * cap)()
            n = lib().llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

    def _piece(self, token: int, special: bool) -> bytes:
        """llama_token_to_piece, with a buffer as large as the piece needs."""
        buf = ctypes.create_string_buffer(64)
        n = lib().llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lib().llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders to (special tokens render empty)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token, False)
        return piece

    def token_text(self, token: int) -> str:
        """Vocabulary text of a token (as stored in the GGUF), for pairing checks and messages."""
        return lib().llama_vocab_get_text(self._vocab, token).decode("utf-8", "replace")

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def render_special(self, tokens: Sequence[int]) -> str:
        """Text of `tokens` with special tokens written out (`<start_of_turn>`, ...): what a program
        that tokenizes with parse_special, such as llama.cpp's own tools, turns back into `tokens`."""
        return b"".join(self._piece(int(t), True) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(lib().llama_vocab_is_eog(self._vocab, token))

    def chat_template(self) -> str | None:
        tmpl = lib().llama_model_chat_template(self._model, None)
        return tmpl.decode("utf-8", "replace") if tmpl else None

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], add_assistant: bool = True,
                            tools: Sequence[dict[str, Any]] | None = None) -> str:
        """Render messages with the chat template stored in the GGUF metadata: the Jinja template
        itself, run in a sandbox (`render_chat_template`), as transformers and llama-server do, so
        the prompt is exactly the model author's format (SmolLM2's template, for one, adds its
        default system message when there is none). `tools`: OpenAI function tools, passed to the
        template as `tools`."""
        return render_chat_template(self._template(), messages, **self._template_kw(add_assistant, tools))

    def chat_parts(self, messages: Sequence[dict[str, Any]], add_assistant: bool = True,
                   tools: Sequence[dict[str, Any]] | None = None) -> list[tuple[str, bool]]:
        """The rendered chat as (text, is the template's own) parts for `tokenize_parts`: a message's
        content is text, even where it holds a control token's text ("<|im_end|>" pasted into a
        message must not end the turn); one part when no content holds any."""
        rendered = self.apply_chat_template(messages, add_assistant, tools)
        pattern = self._control[1]
        if pattern is None or not any(isinstance(m.get("content"), str) and pattern.search(m["content"])
                                      for m in messages):
            return [(rendered, True)]
        return chat_parts(self._template(), messages, rendered, **self._template_kw(add_assistant, tools))

    def _template(self) -> str:
        tmpl = self.chat_template()
        if tmpl is None:
            raise EdgeSpecError(f"{Path(self.path).name} has no chat template in its metadata; drop --chat")
        return tmpl

    def _template_kw(self, add_assistant: bool, tools: Sequence[dict[str, Any]] | None = None) -> dict:
        bos, eos = self.info.bos, self.info.eos
        return {"add_generation_prompt": add_assistant, "name": Path(self.path).name,
                "bos_token": self.token_text(bos) if bos >= 0 else "",
                "eos_token": self.token_text(eos) if eos >= 0 else "", "tools": tools}

    @cached_property
    def _control(self) -> tuple[dict[str, tuple[int, int]], re.Pattern | None]:
        """What tokenizing with parse_special turns into control (or unknown) tokens: their text ->
        (id, attributes), and a pattern that finds them, longest first."""
        llama = lib()
        mask = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_UNKNOWN
        found: dict[str, tuple[int, int]] = {}
        for t in range(self.n_vocab):
            attr = llama.llama_vocab_get_attr(self._vocab, t)
            if attr & mask and self.token_text(t):
                found.setdefault(self.token_text(t), (t, attr))
        if not found:
            return found, None
        return found, re.compile("|".join(re.escape(x) for x in sorted(found, key=len, reverse=True)))

    def tokenize_parts(self, parts: Sequence[tuple[str, bool]], *, add_special: bool = True) -> list[int]:
        """Tokens of a text given as (text, may hold control tokens) parts (`chat_parts`): control-token
        text becomes its token only in the parts that may hold it, and is plain text elsewhere. As
        llama.cpp's tokenizer does with parse_special: the text is cut at control tokens and what lies
        between them is tokenized as text (whitespace beside a token that strips it dropped)."""
        if all(markers for _, markers in parts):
            return self.tokenize("".join(t for t, _ in parts), add_special=add_special, parse_special=True)
        llama = lib()
        specials, pattern = self._control
        info = self.info
        out = [info.bos] if add_special and info.add_bos and info.bos >= 0 else []
        raw, strip_next = "", False
        for text, markers in parts:
            pos = 0
            for m in pattern.finditer(text) if markers and pattern is not None else ():
                tok, attr = specials[m.group()]
                left = raw + _lstrip(text[pos : m.start()], strip_next)
                out += self._text_tokens(left.rstrip(_WS) if attr & llama.LLAMA_TOKEN_ATTR_LSTRIP else left)
                out.append(tok)
                raw, pos, strip_next = "", m.end(), bool(attr & llama.LLAMA_TOKEN_ATTR_RSTRIP)
            rest = _lstrip(text[pos:], strip_next)
            strip_next = strip_next and not rest
            raw += rest
        out += self._text_tokens(raw)
        if add_special and info.add_eos and info.eos >= 0:
            out.append(info.eos)
        return out

    def _text_tokens(self, text: str) -> list[int]:
        return self.tokenize(text, add_special=False) if text else []

    # ----------------------------------------------------------------------------- cache
    @property
    def n_past(self) -> int:
        """Number of tokens whose keys/values are in the cache (the next decode's position)."""
        return len(self._cached)

    @property
    def cached(self) -> tuple[int, ...]:
        """The tokens in the KV cache, in position order (a copy)."""
        return tuple(self._cached)

    def common_prefix(self, tokens: Sequence[int], start: int = 0) -> int:
        """Length of the longest common prefix of the cached tokens and `tokens`; the first `start`
        positions are taken as matching (a caller that knows them saves the comparison)."""
        cached = self._cached
        n = min(len(cached), len(tokens))
        i = min(start, n)
        if n - i > 64:
            a = np.asarray(cached[i:n], dtype=np.int64)
            b = np.asarray(tokens[i:n], dtype=np.int64)
            diff = np.flatnonzero(a != b)
            return i + int(diff[0]) if diff.size else n
        while i < n and cached[i] == tokens[i]:
            i += 1
        return i

    def reuse(self, tokens: Sequence[int], start: int = 0) -> int:
        """Keep the longest cached prefix of `tokens`, drop every cached token after it, and return
        its length: the caller decodes `tokens[returned:]`. Logits of that decode equal a fresh
        context's fed the same tokens in the same batches (tests/test_prefix.py)."""
        n = self.common_prefix(tokens, start)
        self.truncate(n)
        return n

    # ----------------------------------------------------------------------------- decoding
    def decode(self, tokens: Sequence[int], n_logits: int = 1, hidden: bool = False) -> np.ndarray:
        """Append `tokens` at position `n_past`; return logits of the last `n_logits` rows.

        Returns a read-only view [n_logits, n_vocab] (float32) into llama.cpp's buffer, valid until
        the next decode. Inputs longer than the batch are split; only the final chunk has logits.
        hidden=True also keeps the final hidden state of those rows (`last_hidden`); the logits are
        bit-identical either way. Only rows with logits get one: with embeddings on, llama.cpp would
        compute outputs for every row, so they are switched on only for such a call.
        """
        if hidden and n_logits != len(tokens):
            raise ValueError("hidden states need logits on every row of the call")
        self._set_embeddings(hidden)
        self.last_hidden = None
        n = len(tokens)
        if n == 0:
            raise ValueError("decode needs at least one token")
        if n_logits > min(n, self.n_batch):
            raise ValueError("n_logits must not exceed the tokens decoded nor the batch size")
        if self.n_past + n > self.n_ctx:
            raise EdgeSpecError(
                f"context is full: {self.n_past + n} tokens do not fit in n_ctx={self.n_ctx}"
            )
        llama = lib()
        toks = np.asarray(tokens, dtype=np.int32)
        for start in range(0, n, self.n_batch):
            chunk = toks[start : start + self.n_batch]
            m = len(chunk)
            self._b_token[:m] = chunk
            self._b_pos[:m] = np.arange(self.n_past, self.n_past + m, dtype=np.int32)
            first_out = n - n_logits - start  # index inside this chunk of the first row with logits
            self._b_logits[:m] = 0
            if first_out < m:
                self._b_logits[max(first_out, 0) : m] = 1
            self._batch.n_tokens = m
            if self.auto_threads:
                self._follow_free_cores(llama)
            with _CCall():
                rc = _compute.run(llama.llama_decode, self._ctx, self._batch)
            if rc == 0:
                self._cached.extend(chunk.tolist())
            else:  # a failed (or aborted) decode may leave part of the batch behind: drop it
                llama.llama_memory_seq_rm(self._mem, 0, self.n_past, -1)
            _check_interrupt()
            if rc != 0:
                raise EdgeSpecError(f"llama_decode failed with code {rc}: {_last_llama_error()}")
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = llama.llama_get_logits(self._ctx)
        view = np.ctypeslib.as_array(ptr, shape=(n_logits, self.n_vocab))
        view.flags.writeable = False
        if hidden:
            eptr = llama.llama_get_embeddings(self._ctx)
            if not eptr:
                raise EdgeSpecError("llama.cpp returned no hidden states for this model")
            self.last_hidden = np.array(np.ctypeslib.as_array(eptr, shape=(n_logits, self.n_embd)))
        return view

    last_hidden: np.ndarray | None = None  # [rows, n_embd] of the last decode(hidden=True)

    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings_on:
            lib().llama_set_embeddings(self._ctx, on)
            self._embeddings_on = on

    def _follow_free_cores(self, llama: ModuleType) -> None:
        n = min(self.n_threads, threads.governor().threads())
        if n != self.threads_now:
            llama.llama_set_n_threads(self._ctx, n, n)
            self.threads_now = n

    def truncate(self, n: int) -> None:
        """Roll the KV cache back so that only positions [0, n) remain."""
        if n < self.n_past:
            if not lib().llama_memory_seq_rm(self._mem, 0, n, -1):
                raise EdgeSpecError("llama.cpp could not roll back the KV cache (recurrent model?)")
            del self._cached[n:]

    def reset(self) -> None:
        lib().llama_memory_clear(self._mem, True)
        self._cached.clear()

    def close(self) -> None:
        if getattr(self, "file", None) is not None:
            self.file.close()
            self.file = None
        llama = _lib
        if llama is None:
            return
        if getattr(self, "_batch", None) is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class TextStream:
    """Turns token bytes into text incrementally; a multi-byte character split across tokens is
    emitted with the token that completes it."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        return self._dec.decode(self._model.token_bytes(token))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


_WS = " \t\n\v\f\r"  # what llama.cpp's isspace strips beside a token with the LSTRIP/RSTRIP attribute


def _lstrip(text: str, strip: bool) -> str:
    return text.lstrip(_WS) if strip else text
