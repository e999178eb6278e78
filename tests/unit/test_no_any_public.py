"""The public signatures of ``core/``, ``comm/`` and ``planner/`` say what they take and return:
no ``Any``, written or implied (a parameter or return without an annotation, a generic without
its parameters, an alias that stands for ``Any``). mypy checks the code against the signatures;
this checks that the signatures leave it something to check. Public: a function or method whose
name does not start with ``_`` (and the constructor of such a class), in a module and a class
whose names do not start with ``_``. Read from the source (AST), nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "zeropp_hier"
PACKAGES = ("core", "comm", "planner")
# generics of the standard library that mean ``Any`` when written without their parameters
STD_GENERICS = {
    "dict",
    "list",
    "tuple",
    "set",
    "frozenset",
    "type",
    "Dict",
    "List",
    "Tuple",
    "Set",
    "Mapping",
    "MutableMapping",
    "Sequence",
    "Iterable",
    "Iterator",
    "Generator",
    "Callable",
    "Future",
}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _package_generics() -> tuple[set[str], set[str]]:
    """The package's own generic names (classes over a TypeVar, aliases with a TypeVar in them)
    and its aliases that stand for ``Any``, by name, over the whole package."""
    trees = [ast.parse(p.read_text()) for p in ROOT.rglob("*.py")]
    typevars = {
        t.id
        for tree in trees
        for st in tree.body
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
        for t in st.targets
        if isinstance(t, ast.Name) and isinstance(st.value.func, ast.Name) and st.value.func.id == "TypeVar"
    }
    generic, any_aliases = set(), set()
    for tree in trees:
        for st in tree.body:
            if isinstance(st, ast.ClassDef) and any(_names(b) & ({"Generic"} | typevars) for b in st.bases):
                generic.add(st.name)
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                if isinstance(st.value, ast.Subscript) and _names(st.value) & typevars:
                    generic.add(st.targets[0].id)
                if "Any" in _names(st.value):
                    any_aliases.add(st.targets[0].id)
    return generic, any_aliases


GENERIC, ANY_ALIASES = _package_generics()


def _annotation_faults(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        return _annotation_faults(ast.parse(node.value, mode="eval").body)
    faults = []
    subscripted = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Subscript)}
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n is not node:
            faults += _annotation_faults(ast.parse(n.value, mode="eval").body)
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name is None:
            continue
        if name == "Any" or name in ANY_ALIASES:
            faults.append(f"{name} (Any)")
        elif name in STD_GENERICS | GENERIC and id(n) not in subscripted:
            faults.append(f"{name} without its parameters")
    return faults


def _signature_faults(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    if method and args and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list):
        args = args[1:]  # self / cls
    args += [a for a in (fn.args.vararg, fn.args.kwarg) if a is not None]
    faults = []
    for a in args:
        if a.annotation is None:
            faults.append(f"parameter {a.arg} has no annotation")
        else:
            faults += [f"parameter {a.arg}: {f}" for f in _annotation_faults(a.annotation)]
    if fn.returns is None:
        if fn.name != "__init__":
            faults.append("no return annotation")
    else:
        faults += [f"return: {f}" for f in _annotation_faults(fn.returns)]
    return faults


def _public_modules() -> list[Path]:
    return sorted(
        p
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if not p.name.startswith("_") or p.name == "__init__.py"
    )


def _public_functions(tree: ast.Module):
    def public(name: str) -> bool:
        return not name.startswith("_")

    for st in tree.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and public(st.name):
            yield st.name, st, False
        if isinstance(st, ast.ClassDef) and public(st.name):
            for m in st.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and (public(m.name) or m.name == "__init__"):
                    yield f"{st.name}.{m.name}", m, True


@pytest.mark.parametrize("path", _public_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_public_signatures_have_no_any(path):
    tree = ast.parse(path.read_text())
    faults = [
        f"{path.relative_to(ROOT.parent)}:{fn.lineno} {name}: {fault}"
        for name, fn, method in _public_functions(tree)
        for fault in _signature_faults(fn, method)
    ]
    assert not faults, "Any in public signatures (give each a precise type):\n" + "\n".join(faults)


def test_the_check_finds_what_it_looks_for():
    """Each kind of fault is found, so a clean result means something."""
    src = """
def a(x: Any) -> int: ...
def b(x) -> int: ...
def c(x: int): ...
def d(x: dict) -> Mapping[str, int]: ...
def e(x: "list") -> None: ...
def f(x: Job) -> None: ...
def g(x: typing.Any) -> None: ...
def h(x: Mapping[str, object], *rest: int) -> dict[str, Job[int]]: ...
def _private(x): ...
class C:
    def __init__(self, x: int): ...
    def m(self, y: Sequence) -> None: ...
"""
    found = {name: _signature_faults(fn, method) for name, fn, method in _public_functions(ast.parse(src))}
    assert found == {
        "a": ["parameter x: Any (Any)"],
        "b": ["parameter x has no annotation"],
        "c": ["no return annotation"],
        "d": ["parameter x: dict without its parameters"],
        "e": ["parameter x: list without its parameters"],
        "f": ["parameter x: Job without its parameters"],
        "g": ["parameter x: Any (Any)"],
        "h": [],
        "C.__init__": [],
        "C.m": ["parameter y: Sequence without its parameters"],
    }
    assert "Job" in GENERIC and "PerTier" in GENERIC  # the package's own generics are known
