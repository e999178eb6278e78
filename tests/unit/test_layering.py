"""The tree's layers, read from the source (every ``import`` statement, deferred ones inside
functions too; nothing is imported): no import runs up a layer of the package, no circle among
modules (deferred imports included), the app's families and the benchmarks' folders as docs/design.md's module
table draws them, and no module of the package over 600 lines. Pure: ``ast`` over the checkout.

[Note: layers of the tree]
The package's layers, bottom up: ``core``, ``files`` and ``quant`` (nothing of the package below
them) < ``comm``, ``detect``, ``planner``, ``launch`` < ``deepspeed`` < ``app`` < ``tools`` <
``__main__`` (the command). An import may go down or sideways, never up; sideways, the packages
form no circle. The top package itself (``zeropp_hier/__init__.py``) is exempt: it defines
``__version__`` and resolves the public names lazily, so importing it loads no layer.

Inside ``app/`` the spine (spec, run, report, launch, train, ...) stays at the top and each
family is a sub-package: a family imports of ``app/`` only itself, the data family and the job's
spec (``app/spec.py``, plain data). No two modules import each other, not even through an import
deferred into a function: a deferred import hides a circle from the interpreter, not from the
reader, and which module loads first then depends on the call that comes first. A piece two
modules share goes into a small module of its own (``data/split.py``, which ``data/indexed.py`` and
``data/blend.py`` both read; ``job_vocab.py``, which reads ``model/pretrained.py``, which reads
``spec.py``).

``benchmarks/`` holds folders only, each a concern with a docstring naming its result files;
``cluster/`` imports none of the others and the folders form no circle; the package never imports
``benchmarks`` by a statement (``zeropp-hier cluster`` finds it by name, from the checkout).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {
    "core": 0,
    "files": 0,
    "quant": 0,
    "comm": 1,
    "detect": 1,
    "planner": 1,
    "launch": 1,
    "deepspeed": 2,
    "app": 3,
    "dryrun": 4,
    "tools": 4,
    "__main__": 5,
}
FAMILIES = {
    "data": {"tokens", "documents", "indexed", "blend", "split", "prepare_stream", "token_format"},
    "model": {"models", "gpt", "flops", "init_schemes", "pretrained"},
    "longrun": {"chain", "deadline", "resume", "resume_rules", "io_cost"},
    "monitoring": {"monitor", "monitor_run", "chart", "evaluate"},
}
SPINE = {"spec", "job_vocab", "run", "report", "launch", "train", "recipe", "user_config", "memory_check"}
BENCH_FOLDERS = {"compare", "gpu", "cpu", "cluster", "deepspeed_unit", "tables"}
MAX_LINES = 600


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: set[str] = field(default_factory=set)  # every import, deferred ones too
    at_import: set[str] = field(default_factory=set)  # only those run when the module is imported


def _resolve(mod: Module, level: int, target: str | None) -> str:
    if not level:
        return target or ""
    parts = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def _imports(mod: Module, node: ast.AST, deferred: bool, known: set[str]) -> None:
    for child in ast.iter_child_nodes(node):
        inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            inner = True  # for the type checker only, never run
        names: list[str] = []
        if isinstance(child, ast.Import):
            names = [a.name for a in child.names]
        elif isinstance(child, ast.ImportFrom):
            base = _resolve(mod, child.level, child.module)
            # ``from pkg import sub`` imports the module pkg.sub; ``from mod import name`` mod itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
        for n in names:
            if n in known and n != mod.name:
                mod.imports.add(n)
                if not inner:
                    mod.at_import.add(n)
        _imports(mod, child, inner, known)


def modules(top: str) -> dict[str, Module]:
    return _modules_under(ROOT, top)


def _modules_under(root: Path, top: str) -> dict[str, Module]:
    found = {}
    for path in sorted((root / top).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        found[name] = Module(name, path, is_package)
    known = set(found)
    for mod in found.values():
        _imports(mod, ast.parse(mod.path.read_text(), str(mod.path)), False, known)
    return found


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w) :] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def _layer(name: str) -> str | None:
    """The package a module of zeropp_hier belongs to; None for the top package itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_circle_finder_finds_a_circle_and_only_one_that_is_there():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_reader_sees_deferred_imports_and_tells_them_from_import_time_ones():
    pkg = modules("zeropp_hier")
    spec = pkg["zeropp_hier.app.spec"]
    assert "zeropp_hier.app.monitoring.monitor" in spec.at_import
    # read only when the job names an init scheme: deferred, so seen but not at import time
    assert "zeropp_hier.app.model.init_schemes" in spec.imports - spec.at_import
    # ``from . import monitor`` inside monitoring/ is the module, not the package
    assert "zeropp_hier.app.data.prepare_stream" in pkg["zeropp_hier.app.data.tokens"].imports


def test_no_import_goes_up_a_layer_and_the_layers_form_no_circle():
    pkg = modules("zeropp_hier")
    assert {_layer(m) for m in pkg} - {None} == set(LAYERS), "a new layer: place it in LAYERS"
    up = []
    between: dict[str, set[str]] = {}
    for mod in pkg.values():
        here = _layer(mod.name)
        for target in mod.imports:
            there = _layer(target)
            if here is None or there is None or here == there:
                continue
            between.setdefault(here, set()).add(there)
            if LAYERS[there] > LAYERS[here]:
                up.append(f"{mod.name} -> {target}")
    assert not up, f"imports up a layer ([Note: layers of the tree]): {sorted(up)}"
    assert _circle(between) is None, f"the layers import in a circle: {_circle(between)}"
    # what the design's table says, held: core imports nothing of the package above it
    assert not between.get("core", set()) - {"files"}


def test_no_circle_among_modules_deferred_imports_included():
    for top in ("zeropp_hier", "benchmarks"):
        graph = {m.name: m.imports for m in modules(top).values()}
        assert _circle(graph) is None, (
            f"modules import each other in a circle: {_circle(graph)}; move the piece both need into a "
            "module of its own ([Note: layers of the tree])"
        )


def test_the_circle_test_sees_a_circle_closed_by_a_deferred_import(tmp_path):
    # two modules as data/blend.py and data/indexed.py once were: one imports at the top, the
    # other inside a function; the reader must put both edges in the graph the test above checks
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import B\n")
    (pkg / "b.py").write_text("B = 1\n\n\ndef late():\n    from .a import B\n\n    return B\n")
    found = {m.name: m for m in _modules_under(tmp_path, "pkg").values()}
    assert found["pkg.b"].at_import == set() and found["pkg.b"].imports == {"pkg.a"}
    assert _circle({m.name: m.imports for m in found.values()}) == ["pkg.a", "pkg.b", "pkg.a"]


def test_the_app_families_are_folders_and_import_only_down():
    pkg = modules("zeropp_hier")
    app = "zeropp_hier.app."
    top = {m[len(app) :] for m in pkg if m.startswith(app) and m.count(".") == 2 and not pkg[m].is_package}
    assert top <= SPINE, f"app/ holds modules of no family beside the spine: {sorted(top - SPINE)}"
    for family, members in FAMILIES.items():
        folder = pkg[app + family]
        assert folder.is_package and ast.get_docstring(ast.parse(folder.path.read_text()))
        held = {m.rsplit(".", 1)[1] for m in pkg if m.startswith(f"{app}{family}.")}
        assert members <= held, f"app/{family}/ lacks {sorted(members - held)}"
    wrong = []
    for mod in pkg.values():
        if not mod.name.startswith(app) or mod.name.count(".") < 3 or mod.name.startswith(app + "configs"):
            continue
        family = mod.name.split(".")[2]
        for target in mod.imports:
            if not target.startswith(app):
                continue
            allowed = (f"{app}{family}", f"{app}data", f"{app}spec")
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                wrong.append(f"{mod.name} -> {target}")
    assert not wrong, f"a family imports another family or the spine: {sorted(wrong)}"


def test_benchmarks_are_folders_of_one_concern_each():
    bench = modules("benchmarks")
    loose = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules at benchmarks/'s top level, not in a folder: {loose}"
    folders = {p.name for p in (ROOT / "benchmarks").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders - {"results"} == BENCH_FOLDERS
    for folder in BENCH_FOLDERS:
        doc = ast.get_docstring(ast.parse((ROOT / "benchmarks" / folder / "__init__.py").read_text())) or ""
        assert "benchmarks/results/" in doc, f"benchmarks/{folder}/__init__.py does not name its result files"
    between: dict[str, set[str]] = {}
    for mod in bench.values():
        here = mod.name.split(".")[1] if mod.name.count(".") else None
        for target in mod.imports:
            there = target.split(".")[1] if target.count(".") else None
            if here and there and here != there:
                between.setdefault(here, set()).add(there)
    assert not between.get("cluster"), f"the emulated cluster imports a benchmark: {between.get('cluster')}"
    assert _circle(between) is None, f"benchmark folders import in a circle: {_circle(between)}"
    # the package does not import the benchmarks by a statement
    for mod in modules("zeropp_hier").values():
        text = mod.path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level:
                assert not (node.module or "").startswith("benchmarks"), mod.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("benchmarks") for a in node.names), mod.name


def test_no_module_of_the_package_is_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "zeropp_hier").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split by responsibility): {long}"
