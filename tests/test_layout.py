"""The project's layout rules (README "Layout"): no import cycles, no import from a lower layer to a
higher one (imports inside functions and classes included), library code never reads the
repository's layout, the engine never probes with getattr, and an installed copy works without the
repository (packages and package data)."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from edgespec import LAYERS  # noqa: E402  (the one place the layers are written: edgespec/__init__.py)

PACKAGES = ("edgespec", "benchmarks")  # the import graph's nodes
LIBRARY = ("edgespec",)  # code that must not know where the repository is
LAYOUT_STRINGS = (".venv", "../shared", "shared/data", "PROJECT_ROOT")
PROGRAMS = "programs"  # benchmarks/: may import every layer; no layer imports them


# ------------------------------------------------------------------------------------- import graph
def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of import nodes under `if TYPE_CHECKING:` (never executed, so they make no cycle)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for sub in node.body:
                    skip.update(id(n) for n in ast.walk(sub))
    return skip


def imports_of(name: str, path: Path, modules: dict[str, Path], typing: bool = False) -> set[str]:
    """Project modules that `name` imports anywhere in its file (module level, in functions and
    classes; under `if TYPE_CHECKING:` too when `typing`). `from X import Y` counts as importing X.Y
    when that is a module, else X."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = set() if typing else _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import a.b.c` of a non-module attribute: its module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules, typing) for name, path in modules.items()}


def layer_of(module: str) -> str | None:
    """The layer `module` belongs to: its folder under edgespec/ (benchmarks/ holds programs, above
    every layer; the package's own __init__ sits below them all); None when no layer names it."""
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return PROGRAMS
    if parts == ["edgespec"]:
        return "root"
    if parts[0] == "edgespec" and parts[1] in LAYERS:
        return parts[1]
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a lower layer to a higher one, as 'a (layer) -> b (layer)'."""
    rank = {layer: i for i, layer in enumerate(["root", *reversed(LAYERS), PROGRAMS])}  # 0 = the bottom
    out = []
    for mod in sorted(graph):
        for dep in sorted(graph[mod]):
            if rank[layer_of(dep)] > rank[layer_of(mod)]:
                out.append(f"{mod} ({layer_of(mod)}) -> {dep} ({layer_of(dep)})")
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path a -> ... -> a) per strongly connected component that has one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in sccs:  # a shortest cycle through the component's first module (BFS inside it)
        members, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append([start, *reversed(path[:-1]), start])
    return cycles


def describe(cycles: list[list[str]]) -> str:
    return "; ".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle_and_resolves_imports(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    modules = project_modules()
    # `from edgespec.runtime import llama` is an import of the module edgespec.runtime.llama;
    # function-level imports count (session imports nothing lazily, but the bench's Runner does).
    assert "edgespec.runtime.llama" in imports_of("edgespec.service.session", modules["edgespec.service.session"], modules)
    assert "edgespec.service.session" in import_graph()["edgespec.service.bench.runner"]
    assert "edgespec.runtime.profiles" in import_graph()["edgespec.service.bench.runner"]  # imported inside Runner.__init__


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, f"import cycles: {describe(cycles)}"


def test_every_module_has_a_layer():
    unplaced = [m for m in project_modules() if layer_of(m) is None]
    assert not unplaced, f"modules outside the layer folders (edgespec.LAYERS): {unplaced}"


def test_layer_check_sees_an_import_inside_a_function(tmp_path):
    """A lower-layer module that imports a higher one only inside a function (or a method, or
    under TYPE_CHECKING) is caught; the same import the other way round is fine."""
    src = tmp_path / "low.py"  # as if it were edgespec/runtime/low.py
    src.write_text("import os\n\n\nclass A:\n    def f(self):\n        from edgespec.service.session import Session\n"
                   "        return Session\n\n\ndef g():\n    import edgespec.service.pool\n")
    modules = {**project_modules(), "edgespec.runtime.low": src}
    found = imports_of("edgespec.runtime.low", src, modules)
    assert found == {"edgespec.service.session", "edgespec.service.pool"}
    assert upward_imports({"edgespec.runtime.low": found, "edgespec.service.session": {"edgespec.runtime.low"}}) == [
        "edgespec.runtime.low (runtime) -> edgespec.service.pool (service)",
        "edgespec.runtime.low (runtime) -> edgespec.service.session (service)"]
    assert layer_of("edgespec.core.drafters.onnx") == "core" and layer_of("edgespec.apps.ui.render") == "apps"
    assert layer_of("benchmarks.engine_speed") == PROGRAMS and layer_of("edgespec") == "root"
    assert layer_of("edgespec.new_module") is None


def test_layers_are_folders_and_the_readme_names_them():
    """Every layer of edgespec.LAYERS is a folder of the package, every folder directly under
    edgespec/ is a layer, and README's layout section names each layer's folder."""
    folders = {p.name for p in (ROOT / "edgespec").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):readme.index("\n## ", readme.index("## Layout") + 3)]
    assert "edgespec/__init__.py" in layout
    assert all(f"{name}/" in layout for name in LAYERS), [n for n in LAYERS if f"{n}/" not in layout]


def test_no_import_from_a_lower_layer_to_a_higher_one():
    """README's layering, checked on every import: module level, in functions and classes, and
    under TYPE_CHECKING (a type a lower layer names is a dependency on the layer that defines it)."""
    upward = upward_imports(import_graph(typing=True))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


# ------------------------------------------------------------------------------------- library rules
def test_library_code_never_reads_the_repository_layout():
    hits = []
    for pkg in LIBRARY:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for needle in LAYOUT_STRINGS:
                for i, line in enumerate(text.splitlines(), 1):
                    if needle in line:
                        hits.append(f"{path.relative_to(ROOT)}:{i}: {needle}")
    assert not hits, "library code names the repository layout:\n" + "\n".join(hits)


def test_engine_never_probes_with_getattr():
    text = (ROOT / "edgespec" / "core" / "engine.py").read_text(encoding="utf-8")
    hits = [f"engine.py:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
            if "getattr(" in line or "hasattr(" in line]
    assert not hits, "\n".join(hits)


# ------------------------------------------------------------------------------------- installed copy
def install_copy(target: Path, scratch: Path) -> subprocess.CompletedProcess:
    """Install the project into `target` the way pyproject.toml declares it, without network:
    `pip install --no-deps --no-build-isolation --target` when the `wheel` package is there (old
    setuptools cannot build a wheel without it), else setuptools' own build_py into `target`,
    which copies the same packages and package data."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if importlib.util.find_spec("wheel") is not None or _setuptools_has_bdist_wheel():
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--quiet", "--target", str(target), str(ROOT)]
    else:
        cmd = [sys.executable, "-c", "import setuptools; setuptools.setup()", "--quiet",
               "egg_info", "--egg-base", str(scratch), "build_py", "--build-lib", str(target)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def _setuptools_has_bdist_wheel() -> bool:
    return importlib.util.find_spec("setuptools.command.bdist_wheel") is not None


@pytest.mark.slow
def test_installed_copy_imports_and_finds_its_suites(tmp_path):
    """Install (no network), then import the installed copy from a folder outside the repository,
    with the installed path first on sys.path."""
    target = tmp_path / "site"
    scratch = tmp_path / "egg"
    scratch.mkdir()
    build = install_copy(target, scratch)
    assert build.returncode == 0, build.stderr[-3000:]
    top = {p.name for p in target.iterdir() if not p.name.endswith((".dist-info", ".egg-info")) and p.name != "bin"}
    assert top == {"edgespec"}, f"the install holds more than the one package: {sorted(top)}"
    assert (target / "edgespec" / "service" / "suites" / "spec_bench.jsonl").is_file()
    check = """
import sys
from pathlib import Path
site = Path(sys.argv[1]).resolve()
import edgespec.service.bench.runner, edgespec.apps.ui, edgespec.service.session, edgespec.models, edgespec.apps.quant
from edgespec.service.suites import load_suite, shipped_suites
for mod in (edgespec.service.bench.runner, edgespec.apps.ui, edgespec.service.session, edgespec.models,
            edgespec.apps.quant):
    assert site in Path(mod.__file__).resolve().parents, (mod.__name__, mod.__file__)
suites = shipped_suites()
assert set(suites) >= {"code_edit", "spec_bench"}, suites
assert all(site in p.resolve().parents for p in suites.values()), suites
assert len(load_suite("spec_bench")) > 400 and load_suite("code_edit")
folder = suites["spec_bench"].parent
assert (folder / "SPEC_BENCH_LICENSE").read_text().startswith("Apache License")
assert "Spec-Bench" in (folder / "README.md").read_text()
assert (site / "edgespec" / "models" / "catalog.json").is_file()
assert (site / "edgespec" / "apps" / "quant" / "prompts.txt").is_file()
print("ok", len(suites))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", check, str(target)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok")
