"""Injector for running DeepSpeed's own unit tests against zeropp_hier (benchmarks/deepspeed_unit).

``run.py`` puts this directory on PYTHONPATH, so every Python process of a test run (pytest, the
forkserver, every rank of DeepSpeed's ``DistributedTest``) imports it at start-up. It does
nothing unless ``ZEROPP_HIER_PEER_MARKS`` names a directory. Then, once ``deepspeed`` has been
imported, it wraps ``deepspeed.initialize``:

* ``ZEROPP_HIER_PEER_PRESET`` unset (the stock run): the call goes to stock DeepSpeed; a call
  whose config is ZeRO stage 3 leaves a ``stage3`` mark, so the injected runs need only rerun
  the tests that build a stage-3 engine.
* ``ZEROPP_HIER_PEER_PRESET`` = ``frontier`` / ``zeropp``: ``zeropp_hier.patch_deepspeed()`` is
  applied and every stage-3 config gets a ``zeropp_hier`` section with that preset,
  ``ZEROPP_HIER_PEER_COMPRESSION`` (``none`` or ``default``) and a topology that divides the
  world size at that moment (``topology_for_world``). Each injection leaves an ``injected``
  mark; a ``zeropp_hier`` refusal (``HierConfigError`` or the super-offload ``RuntimeError``)
  leaves a ``refused`` mark with its message, and is re-raised unchanged.

The marks are small JSON files in ``ZEROPP_HIER_PEER_MARKS``; the pytest plugin
(``zeropp_peer_plugin.py``) empties the directory before each test and reads it after.
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import json
import os
import sys
import uuid

_MARKS = os.environ.get("ZEROPP_HIER_PEER_MARKS")


def topology_for_world(world: int) -> dict:
    """gcds_per_gpu x gpus_per_node for a world: every tier that can be non-trivial while
    keeping at least two nodes (the compressed tier) whenever world >= 2.

    1 -> 1x1 (1 node); 2 -> 1x1 (2 nodes); 4 -> 2x1 (2 nodes); 8 -> 2x2 (2 nodes);
    16 -> 2x4 (2 nodes); odd worlds -> 1x1.
    """
    gcds = 2 if world % 4 == 0 else 1
    gpus = 1
    for g in (4, 2):
        if world % (gcds * g * 2) == 0:
            gpus = g
            break
    return {"gcds_per_gpu": gcds, "gpus_per_node": gpus}


def _mark(event: str, **fields) -> None:
    if not _MARKS:
        return
    try:
        os.makedirs(_MARKS, exist_ok=True)
        path = os.path.join(_MARKS, f"{event}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
        with open(path, "w") as f:
            json.dump({"event": event, "pid": os.getpid(), **fields}, f)
    except OSError:
        pass


def _world() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except Exception:
        pass
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _load(cfg):
    if isinstance(cfg, dict):
        return cfg
    if isinstance(cfg, (str, os.PathLike)) and os.path.isfile(cfg):
        with open(cfg) as f:
            return json.load(f)
    return None


def _stage(cfg) -> int | None:
    if not isinstance(cfg, dict):
        return None
    zero = cfg.get("zero_optimization") or {}
    return zero.get("stage") if isinstance(zero, dict) else None


def _section(world: int) -> dict:
    section = {"enabled": True, "preset": os.environ["ZEROPP_HIER_PEER_PRESET"], "topology": topology_for_world(world)}
    if os.environ.get("ZEROPP_HIER_PEER_COMPRESSION", "default") == "none":
        section["compression"] = "none"
    if os.environ.get("ZEROPP_HIER_PEER_OVERLAP"):  # run.py --overlap gpu: the GPU's issue mode
        section["overlap"] = os.environ["ZEROPP_HIER_PEER_OVERLAP"]
    return section


def _find_config(args, kwargs):
    """Where the DeepSpeed config of this initialize call is: ('kw', name) or ('args', ns)."""
    for name in ("config", "config_params"):
        if kwargs.get(name) is not None:
            return ("kw", name)
    ns = kwargs.get("args", args[0] if args else None)
    if ns is not None and getattr(ns, "deepspeed_config", None) is not None:
        return ("args", ns)
    return None


def _rebuild_exception(cls, args, state):
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e


def _reduce_exception(self):
    return (_rebuild_exception, (type(self), self.args, dict(self.__dict__)))


def _pickle_shim() -> None:
    """Harness work-around, not a fix: zeropp_hier's exceptions take keyword/several arguments
    that ``BaseException.__reduce__`` does not replay, so unpickling one raises TypeError. In a
    ``multiprocessing.Pool`` (DeepSpeed's DistributedTest) that kills the parent's result thread
    and the parent waits forever. Give each a ``__reduce__`` so that a refusal raised in a rank
    reaches pytest; ``ZEROPP_HIER_PEER_PICKLE_SHIM=0`` turns this off to see the bug."""
    if os.environ.get("ZEROPP_HIER_PEER_PICKLE_SHIM", "1") == "0":
        return
    import zeropp_hier

    for name in ("HierConfigError", "HierTopologyError", "HierNonFiniteError", "HierCommError", "HierCheckpointError"):
        cls = getattr(zeropp_hier, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            cls.__reduce__ = _reduce_exception


def _wrap(ds) -> None:
    inject = bool(os.environ.get("ZEROPP_HIER_PEER_PRESET"))
    if inject:
        import zeropp_hier

        _pickle_shim()
        zeropp_hier.patch_deepspeed()
        _mark("patched", zeropp_hier=os.path.dirname(zeropp_hier.__file__))
    inner = ds.initialize

    def initialize(*args, **kwargs):
        where = _find_config(args, kwargs)
        restore = None
        injected = False
        if where is not None:
            raw = kwargs[where[1]] if where[0] == "kw" else where[1].deepspeed_config
            cfg = _load(raw)
            if _stage(cfg) == 3:
                _mark("stage3")
                if inject and "zeropp_hier" not in cfg:
                    world = _world()
                    cfg = copy.deepcopy(cfg)
                    cfg["zeropp_hier"] = _section(world)
                    _mark("injected", world=world, section=cfg["zeropp_hier"])
                    injected = True
                    if where[0] == "kw":
                        kwargs[where[1]] = cfg
                    else:  # a config file named by args.deepspeed_config: write the injected copy
                        path = os.path.join(_MARKS, f"cfg-{os.getpid()}-{uuid.uuid4().hex[:8]}.json.txt")
                        with open(path, "w") as f:
                            json.dump(cfg, f)
                        restore = (where[1], where[1].deepspeed_config)
                        where[1].deepspeed_config = path
        try:
            out = inner(*args, **kwargs)
        except Exception as e:
            if inject:
                from zeropp_hier import HierConfigError

                if isinstance(e, HierConfigError) or (isinstance(e, RuntimeError) and "zeropp_hier" in str(e)):
                    _mark("refused", type=type(e).__name__, field=getattr(e, "field", None), msg=str(e)[:2000])
            raise
        finally:
            if restore is not None:
                restore[0].deepspeed_config = restore[1]
        if injected:
            engine = out[0] if isinstance(out, (tuple, list)) and out else out
            _mark(
                "engine",
                cls=type(engine).__name__,
                optimizer=type(getattr(engine, "optimizer", None)).__name__,
                hier=getattr(engine, "hier_runtime", None) is not None,
            )
        return out

    initialize.__wrapped__ = inner
    initialize._zeropp_peer = True
    ds.initialize = initialize


class _AfterDeepSpeedImport(importlib.abc.MetaPathFinder):
    """Runs ``_wrap(deepspeed)`` right after the ``deepspeed`` package finished importing."""

    def find_spec(self, name, path=None, target=None):
        if name != "deepspeed":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_and_wrap
        sys.meta_path.remove(self)
        return spec


if _MARKS:
    if "deepspeed" in sys.modules:
        _wrap(sys.modules["deepspeed"])
    else:
        sys.meta_path.insert(0, _AfterDeepSpeedImport())
