"""Imports during which ``torch.compile`` compiles on first call, not at import
([Note: compile on first call])."""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# DeepSpeed's engine imports this when it is built (its optimizer check and its ZeRO-3 optimizer
# ask whether the optimizer is Muon), and every rank of a job imports it at start-up
# (``world.RANK_MODULES``).
MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"

# [Note: compile on first call]
# DeepSpeed's Muon module decorates three functions with ``torch.compile`` when it is imported, and
# DeepSpeed's engine imports that module when it is built, whatever the optimizer. torch
# compiles nothing until a decorated function is first called, but building the decorator imports
# dynamo and inductor, paid by each of a job's ranks for functions that a job without Muon never
# calls. Measured by importing the module in a fresh process after torch and DeepSpeed (torch
# 2.13, DeepSpeed 0.19.8): 2.4-3.6 CPU-s and 116 MB of host memory per rank; after transformers'
# GPT-NeoX too, which imports dynamo itself, 0.9 CPU-s and 41 MB (inductor's compiler); with the
# swap, 0.0 s and no memory.
# So those imports run with ``torch.compile`` swapped for ``_deferred``: it returns a wrapper that
# calls the real ``torch.compile`` with the same arguments on its first call and then calls what
# that returned, so a job with Muon compiles the same functions the same way, a call later. Inside a
# region torch is compiling, the wrapper calls the plain function: the compiler traces it inline,
# as it treats a compiled function it meets while tracing. The swap holds only while the import
# runs, under a lock, and only the ranks' start-up imports (``world.import_frozen``) and
# ``zeropp_hier.initialize``'s import of Muon, before DeepSpeed's own, get it.
_SWAP = threading.Lock()


class _CompileOnFirstCall:
    """``torch.compile(fn, **options)``, made when first called."""

    def __init__(self, compile_fn: Callable[..., Any], fn: Callable[..., Any], options: dict[str, Any]):
        functools.update_wrapper(self, fn)
        self._compile, self._fn, self._options = compile_fn, fn, options
        self._compiled: Callable[..., Any] | None = None

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        if torch.compiler.is_compiling():
            return self._fn(*args, **kwargs)
        if self._compiled is None:
            self._compiled = self._compile(self._fn, **self._options)
        return self._compiled(*args, **kwargs)


def _deferred(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for ``torch.compile`` (``compile_fn``) in both its forms: ``torch.compile(fn,
    **options)`` and ``torch.compile(**options)`` returning a decorator."""

    def deferred(model: Callable[..., Any] | None = None, **options: Any) -> Any:
        if model is None:
            return lambda fn: _CompileOnFirstCall(compile_fn, fn, options)
        return _CompileOnFirstCall(compile_fn, model, options)

    return deferred


@contextmanager
def compile_on_first_call() -> Iterator[None]:
    """While inside, ``torch.compile`` returns a wrapper that compiles on its first call."""
    import torch

    with _SWAP:
        real = torch.compile
        torch.compile = _deferred(real)
        try:
            yield
        finally:
            torch.compile = real


def import_deferring_compile(name: str) -> Any:
    """``importlib.import_module(name)``, with the module's own ``torch.compile`` calls deferred
    to first call when this process imports it now ([Note: compile on first call])."""
    if name in sys.modules:
        return sys.modules[name]
    with compile_on_first_call():
        return importlib.import_module(name)
