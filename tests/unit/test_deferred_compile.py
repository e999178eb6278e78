"""Imports during which ``torch.compile`` compiles on first call ([Note: compile on first call] in
zeropp_hier/launch/deferred_compile.py): DeepSpeed's Muon module imported so brings in no torch
compiler, and a deferred function compiles with the arguments it was given, once, at its first
call, and returns what the compiled function returns."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from zeropp_hier.launch import deferred_compile
from zeropp_hier.launch.deferred_compile import MUON_MODULE, compile_on_first_call, import_deferring_compile

ROOT = Path(__file__).resolve().parents[2]


def test_muon_imported_in_a_fresh_process_brings_no_compiler_in():
    """In a fresh interpreter (the module imports once per process): after DeepSpeed and the Muon
    module, neither dynamo's frame converter nor inductor is imported, Muon's functions are the
    deferred wrappers, not yet compiled, and ``torch.compile`` is torch's own again. The same
    import without the swap does bring inductor in: what the swap saves is real."""
    code = textwrap.dedent(
        f"""
        import json, sys, torch, deepspeed
        real = torch.compile
        from zeropp_hier.launch.deferred_compile import import_deferring_compile
        import_deferring_compile({MUON_MODULE!r})
        import deepspeed.runtime.zero.muon.original_muon as m
        fns = [m.zeropower_via_newtonschulz5, m.muon_update]
        print(json.dumps({{
            "inductor": "torch._inductor.compile_fx" in sys.modules,
            "restored": torch.compile is real,
            "deferred": [type(f).__name__ for f in fns],
            "compiled": [f.compiled for f in fns],
            "names": [f.__name__ for f in fns],
        }}))
        """
    )
    plain = f"import sys, torch, deepspeed, {MUON_MODULE}; print('torch._inductor.compile_fx' in sys.modules)"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    rep = json.loads(got.stdout.strip().splitlines()[-1])
    assert rep == {
        "inductor": False,
        "restored": True,
        "deferred": ["_CompileOnFirstCall"] * 2,
        "compiled": [False, False],
        "names": ["zeropower_via_newtonschulz5", "muon_update"],
    }, rep
    ref = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, env=env, timeout=300)
    assert ref.returncode == 0 and ref.stdout.strip().splitlines()[-1] == "True", ref.stderr[-3000:]


def test_a_deferred_function_compiles_once_at_first_call_with_its_arguments(monkeypatch):
    calls = []
    real = torch.compile

    def recording_compile(fn=None, **options):
        calls.append((fn, options))
        return real(fn, **options)

    monkeypatch.setattr(torch, "compile", recording_compile)

    def double(x):
        return x * 2

    def plus_one(x):
        return x + 1

    with compile_on_first_call():
        # both forms of torch.compile: a decorator factory, and the function itself
        a = torch.compile(backend="eager", dynamic=False)(double)
        b = torch.compile(plus_one, backend="eager")
    assert torch.compile is recording_compile and calls == []  # the swap ended; nothing compiled yet
    x = torch.arange(4.0)
    assert torch.equal(a(x), x * 2) and torch.equal(b(x), x + 1)
    assert calls == [(double, {"backend": "eager", "dynamic": False}), (plus_one, {"backend": "eager"})]
    assert torch.equal(a(x + 1), (x + 1) * 2) and len(calls) == 2  # compiled once
    assert a.__name__ == "double" and a.compiled and b.compiled


def test_inside_a_compiled_region_the_plain_function_is_traced():
    """Called while torch compiles a caller, the wrapper hands the compiler the plain function (it
    traces it inline), and compiles nothing of its own."""
    with compile_on_first_call():
        inner = torch.compile(lambda x: x.sin(), backend="eager")
    outer = torch.compile(lambda x: inner(x) + 1, backend="eager")
    x = torch.linspace(0, 1, 5)
    assert torch.allclose(outer(x), x.sin() + 1)
    assert not inner.compiled


def test_an_imported_module_is_returned_as_it_is():
    assert import_deferring_compile("json") is json
    assert deferred_compile._SWAP.acquire(blocking=False)  # no swap left holding the lock
    deferred_compile._SWAP.release()
