"""python -m edgespec.models list|pull|info|remove|ensure-bundled: the local model store from a terminal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from edgespec.models import (
    BUNDLED,
    HF_PREFIX,
    MODELS_DIR,
    STORE_DIR,
    bundled_path,
    catalog,
    pypi,
    remove,
    resolve,
    resolve_local,
)
from edgespec.models.derive import derived_target
from edgespec.models.inspect import (
    DEFAULT_MEMORY_CONTEXT,
    inspect_gguf,
    kv_cache_bytes,
    pairing_from_metadata,
    read_header,
)
from edgespec.runtime.errors import EdgeSpecError, run_command


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line, not usage plus error (edgespec.apps.args.Parser's
    rule; that module is a consumer, above this one)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _size(n: int | float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _installed() -> list[dict[str, Any]]:
    """Every GGUF on this machine that `resolve` can name (bundled, HF cache, edgespec/models/, edgespec/models/store/),
    and the derived SmolLM2 Q8_0 target once `python -m edgespec.models derive` has made it."""
    from edgespec.models import hub

    by_file = {(e["repo"], e["file"]): e for e in catalog.load() if not e["bundled"]}
    out = []
    for name in BUNDLED:
        try:
            path = bundled_path(name)
        except EdgeSpecError:
            continue
        entry = catalog.find(name) or {}
        out.append({"name": name, "path": path, "size_bytes": path.stat().st_size,
                    "role": entry.get("role", "?"), "source": "bundled"})
    for entry in catalog.load():
        path = pypi.installed_path(entry) if pypi.is_pypi(entry) else None
        if path is not None:
            out.append({"name": entry["name"], "path": path, "size_bytes": path.stat().st_size,
                        "role": entry["role"], "source": "pypi"})
    for item in hub.installed():
        entry = by_file.get((item["repo"], item["file"]), {})
        out.append({"name": entry.get("name", item["spec"]), "path": item["path"], "size_bytes": item["size_bytes"],
                    "role": entry.get("role", "?"), "source": "hf cache"})
    for folder in (MODELS_DIR, STORE_DIR):
        for p in sorted(folder.glob("*.gguf")) if folder.is_dir() else []:
            out.append({"name": p.name, "path": p, "size_bytes": p.stat().st_size, "role": "?", "source": "local"})
    derived = derived_target()
    if derived.is_file():
        out.append({"name": derived.name, "path": derived, "size_bytes": derived.stat().st_size, "role": "target",
                    "source": "derived"})
    return out


def _pairs(path: Path, others: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """(drafts for `path`, targets `path` can draft for, non-pairs with reasons).

    A draft is never larger than its target; a model of equal size is checked both ways.
    """
    drafts, targets, no = [], [], []
    size = path.stat().st_size
    for o in others:
        if Path(o["path"]).resolve() == path.resolve():
            continue
        roles = ([(path, o["path"], drafts)] if o["size_bytes"] <= size else []) + (
            [(o["path"], path, targets)] if o["size_bytes"] >= size else [])
        for target, draft, bucket in roles:
            try:
                ok, why = pairing_from_metadata(target, draft)
            except EdgeSpecError as exc:
                ok, why = False, str(exc)
            if ok:
                bucket.append(o["name"])
            elif bucket is drafts or o["size_bytes"] != size:
                no.append(f"{o['name']}: {why}")
    return drafts, targets, no


def cmd_list(args: argparse.Namespace) -> int:
    models = _installed()
    print("Installed:")
    for m in models:
        try:
            info = inspect_gguf(m["path"])
            quant, desc = info["file_type_name"] or "?", info["description"]
        except EdgeSpecError as exc:
            quant, desc = "?", f"unreadable ({exc})"
        print(f"  {m['name']:44s} {m['role']:6s} {quant:8s} {_size(m['size_bytes']):>9s}  {desc:20s} {m['source']:8s} "
              f"{m['path']}")
    if not models:
        print("  (none)")
    if not derived_target().is_file():
        print(f"  {derived_target().name:44s} target Q8_0     not made yet: python -m edgespec.models derive "
              "(same-vocabulary target for the bundled smollm2-135m)")
    pairs = []
    for m in models:
        drafts, _, _ = _pairs(Path(m["path"]), models)
        pairs += [f"  {m['name']} <- {d}" for d in drafts]
    print("Pairs among installed models (target <- draft, llama.cpp rule on GGUF metadata):")
    print("\n".join(pairs) if pairs else "  (none)")
    names = {m["name"] for m in models}
    groups = "; ".join(f"{k} = {' + '.join(v)}" for k, v in catalog.sets().items())
    print(f"Catalog, not installed (python app.py models install NAME; sets: {groups}):")
    for e in catalog.load():
        if e["name"] in names:
            continue
        approx = "~" if e.get("size_approx") else ""
        print(f"  {e['name']:30s} {e['role']:6s} {e['quant']:8s} {approx + _size(e['size_bytes']):>10s}  "
              f"{'/'.join(e['use']):9s} {e['license']}; pairs with {', '.join(e['pairs_with'])}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    """Install catalog models (or a set such as coder-pair) by name (edgespec.models.install)."""
    from edgespec.models import install

    for name in args.names:
        for path in install(name, show_bar=sys.stderr.isatty()):
            print(f"{path.name}: {path} ({_size(path.stat().st_size)})")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from edgespec.models import hub

    for name in args.names:
        entry = catalog.find(name)
        if pypi.is_pypi(entry):
            path = pypi.install(entry, show_bar=sys.stderr.isatty())
        elif name.startswith(HF_PREFIX):
            path = hub.pull(name, show_bar=True)
        elif entry is not None and not entry["bundled"]:
            path = hub.pull(f"{HF_PREFIX}{entry['repo']}:{entry['file']}", show_bar=True)
        elif name in BUNDLED or entry is not None:
            path = bundled_path(entry["name"] if entry else name)
        else:
            resolve(name)  # raises the unknown-name error with suggestions, or accepts a local file
            raise EdgeSpecError(f"{name} is a local file already; nothing to pull")
        print(f"{name}: {path} ({_size(path.stat().st_size)})")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    entry = catalog.find(args.name)
    path = resolve_local(args.name)
    if args.ctx <= 0:
        raise EdgeSpecError(f"--ctx must be a positive number of tokens, got {args.ctx}")
    if path is None:
        if entry is not None:
            print(json.dumps({k: entry[k] for k in ("name", "role", "repo", "file", "quant", "size_bytes",
                                                    "license", "use", "pairs_with")}, indent=2))
        print(f"not installed: python app.py models install {args.name}")
        return 0
    info = inspect_gguf(path)
    info["kv_bytes"] = kv_cache_bytes(read_header(path).metadata, args.ctx)
    info["memory_bytes"] = info["weights_bytes"] + info["kv_bytes"]
    drafts, targets, no = _pairs(path, _installed())
    if args.json:
        info.pop("tensor_types")
        info.update(n_ctx=args.ctx, drafts=drafts, drafts_for=targets, does_not_pair=no)
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"path:            {info['path']}")
    print(f"architecture:    {info['architecture']} ({info['name']})")
    print(f"parameters:      {info['n_params'] / 1e6:,.1f} M ({info['description']})")
    print(f"layers:          {info['n_layer']}, embedding {info['n_embd']}, heads {info['n_head']} (KV heads {info['n_head_kv']})")
    print(f"context length:  {info['context_length']} (trained)")
    print(f"quantization:    {info['file_type_name']} (file type); per tensor:")
    for qtype, q in info["quantization"].items():
        print(f"  {qtype:8s} {q['tensors']:4d} tensors  {q['params'] / 1e6:9.1f} M params  {_size(q['bytes']):>9s}")
    print(f"chat template:   {'yes' if info['has_chat_template'] else 'no'}")
    print(f"tokenizer:       {info['tokenizer_type']}, {info['vocab_size']} tokens, fingerprint {info['vocab_fingerprint']}, "
          f"BOS {info['bos_id']} (add {info['add_bos']}), EOS {info['eos_id']} (add {info['add_eos']})")
    print(f"memory estimate: {_size(info['memory_bytes'])} = weights {_size(info['weights_bytes'])} + "
          f"F16 KV cache {_size(info['kv_bytes'])} at {args.ctx} tokens (compute buffers not included)")
    print(f"drafts for it:   {', '.join(drafts) or '(none installed)'}  [checked: llama.cpp rule on GGUF metadata]")
    print(f"it drafts for:   {', '.join(targets) or '(none installed)'}")
    for line in no:
        print(f"does not pair:   {line}")
    if entry is not None:
        installed = {m["name"] for m in _installed()}
        missing = [n for n in entry["pairs_with"] if n not in installed]
        if missing:
            print(f"catalog pairs:   {', '.join(missing)} (not installed, so not checked)")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    for p in remove(args.name, force=args.force):
        print(f"removed {p}")
    return 0


def cmd_ensure_bundled(args: argparse.Namespace) -> int:
    for name in BUNDLED:
        path = bundled_path(name)
        print(f"{name:14s} {path.stat().st_size / 1e6:7.1f} MB  {path}")
    return 0


def cmd_derive(args: argparse.Namespace) -> int:
    from edgespec.models.derive import DERIVED_DIR, derive_pair

    target, draft = derive_pair(Path(args.out) if args.out else DERIVED_DIR)
    print(f"target {target}  ({target.stat().st_size / 1e6:.0f} MB)")
    print(f"draft  {draft}  ({draft.stat().st_size / 1e6:.0f} MB)")
    print(f"try:   python app.py --headless --chat --target {target} --draft {draft} --prompt '...'")
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m edgespec.models") -> int:
    ap = Parser(prog=prog, description="Installed, catalog and Hub models.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    sub.add_parser("list", help="installed models, which pair, and the catalog").set_defaults(fn=cmd_list)
    p = sub.add_parser("install", help="install catalog models or sets by name (e.g. coder-pair), from PyPI or the Hub")
    p.add_argument("names", nargs="+")
    p.set_defaults(fn=cmd_install)
    p = sub.add_parser("pull", help="download catalog or hf:ORG/REPO[:FILE] models into the HF cache")
    p.add_argument("names", nargs="+")
    p.set_defaults(fn=cmd_pull)
    p = sub.add_parser("info", help="GGUF metadata, memory estimate and pairing of one model")
    p.add_argument("name")
    p.add_argument("--ctx", type=int, default=DEFAULT_MEMORY_CONTEXT, help="context for the KV estimate (tokens)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_info)
    p = sub.add_parser("remove", help="delete a downloaded model from the HF cache")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="remove it even while a running program has it loaded")
    p.set_defaults(fn=cmd_remove)
    sub.add_parser("ensure-bundled", help="locate (and assemble) the bundled default models").set_defaults(
        fn=cmd_ensure_bundled)
    p = sub.add_parser("derive", help="make the same-vocabulary SmolLM2 pair (Q8_0 target, bundled Q4_1 draft)")
    p.add_argument("--out", default=None, help="folder for the derived target (default ~/.cache/edgespec/derived)")
    p.set_defaults(fn=cmd_derive)

    def run() -> int:  # --help too: `| head -1` ends it quietly
        args = ap.parse_args(argv)
        for name in getattr(args, "names", None) or [getattr(args, "name", "x")]:
            if not name.strip():
                raise EdgeSpecError(f"models {args.cmd} needs a model name, got an empty one (models list shows them)")
        return args.fn(args)

    return run_command(run)


if __name__ == "__main__":
    sys.exit(main())
