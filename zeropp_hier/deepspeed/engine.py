"""``zeropp_hier.initialize``: ``deepspeed.initialize`` with the hierarchical stage 3.

[Note: engine hook]
``deepspeed.initialize`` constructs ``DeepSpeedEngine`` by its module-level name, and the engine
constructs ``DeepSpeedZeroOptimizer_Stage3`` by a name imported at call time; DeepSpeed has no
registry for either. We rebind each name for the duration of the one call that uses it
(``_rebound``), and restore it in ``finally`` even when construction fails, so stock DeepSpeed
engines built before or after are untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any, Sequence

import deepspeed
import deepspeed.runtime.engine as _ds_engine_module

# DeepSpeed's engine imports this module while choosing a stage-3 class; import it first so
# that its own import cannot capture our temporarily rebound name (docs/design.md#deepspeed-hook-points).
import deepspeed.runtime.superoffload.superoffload_stage3  # noqa: F401
import deepspeed.runtime.zero.stage3 as _ds_stage3
import torch
import torch.distributed as dist
from deepspeed.runtime.engine import DeepSpeedEngine

from ..comm.agree import agree_local, agree_same
from ..comm.boundary import check_alone, quiesce
from ..comm.failures import DEEPSPEED_OWN_TIMEOUT, bound_groups, group_timeout, restore_groups, world_guard
from ..core.config import MODEL_PARALLEL_FIX, HierConfig, hier_config_from_ds
from ..core.errors import (
    HierCheckpointError,
    HierConfigError,
    HierNonFiniteError,
    HierSkippedStepsError,
    HierUnsafeSaveError,
)
from ..detect.launch_env import check_launch_env
from ..launch.deferred_compile import MUON_MODULE, import_deferring_compile
from . import checkpoint
from .checkpoint import safe_load
from .partition import HierOffload, _load_ds_config, runtime_of
from .runtime import HierRuntime, topology_for
from .stage3 import HierZeroOptimizer_Stage3


@contextlib.contextmanager
def _rebound(module, name: str, value):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class HierEngine(DeepSpeedEngine):
    """DeepSpeed's engine; builds the hierarchical stage-3 optimizer and labels the phase
    (forward / backward) that each gather belongs to."""

    def __init__(self, *args, hier_config: HierConfig, **kwargs):
        self.hier_config = hier_config
        self.hier_runtime: HierRuntime | None = None
        self._ds_group_timeouts: list = []  # DeepSpeed's group timeouts before ours, for destroy
        self.ds_group_timeout_s: float | None = None  # the timeout DeepSpeed's groups run with
        self.ds_group_timeout_setting = DEEPSPEED_OWN_TIMEOUT  # reported with a timeout of theirs
        self._step_failed: str | None = None  # what ended a step half done (no save after it)
        super().__init__(*args, **kwargs)

    def _configure_zero_optimizer(self, optimizer):
        runtime = None
        for p in self.module.parameters():  # model built under zeropp_hier.Init: reuse its runtime
            runtime = runtime_of(p)
            if runtime is not None:
                break
        auto_record = None
        if runtime is None:
            cfg = self.hier_config
            if cfg.preset == "auto":  # collective, like HierRuntime.create ([Note: auto preset])
                from deepspeed.accelerator import get_accelerator

                from .auto import resolve
                from .runtime import topology_for

                topo = topology_for(cfg, dist.get_world_size())
                device = torch.device(get_accelerator().current_device_name())
                zc = getattr(getattr(self, "_config", None), "zero_config", None)  # DeepSpeed's buckets
                cfg, auto_record = resolve(
                    cfg,
                    self.module,
                    topo,
                    dist.get_rank(),
                    device,
                    reduce_bucket=getattr(zc, "reduce_bucket_size", None),
                    prefetch_bucket=getattr(zc, "prefetch_bucket_size", None),
                )
                # the topology found (or detected) once: the runtime must not detect it again
                found = dataclasses.replace(
                    cfg.topology,
                    mode="manual",
                    gcds_per_gpu=topo.gcds_per_gpu,
                    gpus_per_node=topo.gpus_per_node,
                    rank_map=topo.rank_map,
                )
                cfg = dataclasses.replace(cfg, topology=found)
            runtime = HierRuntime.create(cfg)
            runtime.auto_choice = auto_record
        elif runtime.cfg != self.hier_config and auto_record is None:
            raise RuntimeError(
                "zeropp_hier: the model was built under zeropp_hier.Init with a "
                "different zeropp_hier section than the one passed to initialize; "
                "use the same config for both"
            )
        self.hier_runtime = runtime
        runtime.numerics.bind_step_counter(self)  # numerics reports steps as global_steps
        factory = functools.partial(HierZeroOptimizer_Stage3, hier_runtime=runtime)
        # Without an optimizer (evaluation, inference) DeepSpeed builds its parameter manager
        # alone, by the engine module's name for it: ours, so the gathers still take the hops.
        offload = functools.partial(HierOffload, hier_runtime=runtime)
        with (
            _rebound(_ds_stage3, "DeepSpeedZeroOptimizer_Stage3", factory),
            _rebound(_ds_engine_module, "DeepSpeedZeRoOffload", offload),
        ):
            opt = super()._configure_zero_optimizer(optimizer)
        if not isinstance(opt, (HierZeroOptimizer_Stage3, HierOffload)):
            raise RuntimeError(
                f"zeropp_hier: DeepSpeed built {type(opt).__name__}, not the "
                "hierarchical stage 3 (super_offload is not supported)"
            )
        # kept level per layer under a memory budget ([Note: kept levels] in core/levels.py)
        named = list(self.module.named_parameters())
        level_plan = runtime.set_levels(named) if named else None
        # local and deterministic, but from this rank's view of the model: confirmed before the
        # first gather uses it ([Note: agreed local checks] in comm/agree.py)
        agree_same("kept level per layer", {"levels": None if level_plan is None else dict(level_plan.levels)})
        if level_plan is not None and runtime.rank == 0:
            from ..core.levels import summarize

            order = list(dict.fromkeys(level_plan.levels))
            runs = ", ".join(f"{lay}: {lvl}" for lay, lvl in summarize(level_plan, order))
            print(
                f"[zeropp_hier] kept copies within {runtime.cfg.memory.kept_shards_gb:g} GB per GCD: "
                f"{level_plan.kept_bytes / 1e9:.3f} GB planned; {runs}",
                flush=True,
            )
        # DeepSpeed's own collectives (the gradient-norm all-reduce of every step, checkpoint
        # barriers) run on its groups. They keep their own timeout (torch's 30 min, or what
        # init_distributed was given) unless deepspeed_group_timeout_s asks for another
        # ([Note: failure detection]); the guard around them reports the one in force, under
        # the name of the setting it came from.
        dp_group = getattr(opt, "dp_process_group", None)  # none without an optimizer
        ds_groups = [dp_group, *(getattr(p, "ds_process_group", None) for p in self.module.parameters())]
        wanted = self.hier_config.deepspeed_group_timeout_s
        if wanted is not None:
            self._ds_group_timeouts = bound_groups(ds_groups, wanted)
        current = group_timeout(dp_group) if dp_group is not None else None
        self.ds_group_timeout_s = wanted if current is None else current.total_seconds()
        self.ds_group_timeout_setting = "deepspeed_group_timeout_s" if wanted is not None else DEEPSPEED_OWN_TIMEOUT
        return opt

    def _phase(self, phase: str):
        rt = self.hier_runtime
        if rt is None:
            return contextlib.nullcontext()
        return _rebound(rt, "phase", phase)

    def _guard(self, phase: str):
        """DeepSpeed's own collectives failing on a dead or stuck peer end as HierCommError."""
        rt = self.hier_runtime
        if rt is None:
            return contextlib.nullcontext()
        return world_guard(
            rt.topo, rt.rank, f"DeepSpeed {phase}", self.ds_group_timeout_s, self.ds_group_timeout_setting
        )

    @contextlib.contextmanager
    def _failure_breaks(self, phase: str):
        """An exception that leaves a step half-done breaks the executor: collectives may have
        run on some ranks and not on others, so nothing more is issued and no save is allowed
        ([Note: executor failure semantics] in comm/executor.py). Errors that every rank raises
        at the same point with its collectives complete (non-finite gradients under "raise", the
        cap on skipped steps, a refused config) leave the ranks in step and do not."""
        try:
            yield
        except (HierNonFiniteError, HierSkippedStepsError, HierConfigError):
            raise
        except BaseException as e:
            rt = self.hier_runtime
            if rt is not None:
                rt.executor.mark_broken(e)
            self._step_failed = f"{type(e).__name__} in {phase}"
            raise

    def _quiesce(self, what: str) -> None:
        """Nothing of ours in flight before ``what`` ([Note: quiet boundaries] in comm/boundary.py)."""
        rt = self.hier_runtime
        if rt is not None:
            quiesce(rt.executor, what)

    def forward(self, *inputs, **kwargs):
        if self.hier_runtime is not None:
            check_alone(self.hier_runtime.executor, "a forward pass")
        with self._failure_breaks("forward"), self._phase("forward_gather"), self._guard("forward"):
            return super().forward(*inputs, **kwargs)

    def backward(self, loss, *args, **kwargs):
        with self._failure_breaks("backward"), self._phase("backward_gather"), self._guard("backward"):
            return super().backward(loss, *args, **kwargs)

    def step(self, *args, **kwargs):
        with self._failure_breaks("step"), self._guard("step"):
            if self.is_gradient_accumulation_boundary():  # the optimizer step's collectives follow
                self._quiesce("the optimizer step")
            return super().step(*args, **kwargs)

    def destroy(self):
        restore_groups(self._ds_group_timeouts)
        self._ds_group_timeouts = []
        out = super().destroy()
        if self.hier_runtime is not None:
            self.hier_runtime.close()
        return out

    def save_checkpoint(
        self, save_dir, tag=None, client_state=None, save_latest=True, exclude_frozen_parameters=False
    ):
        """DeepSpeed's save made atomic: ``latest`` moves only after every rank's files are
        written, fsynced and recorded in a manifest ([Note: atomic checkpoint])."""
        self._refuse_unsafe_save()
        self._quiesce("a checkpoint save")
        client_state = {} if client_state is None else client_state  # DeepSpeed's default, not shared
        return checkpoint.save(
            self,
            super().save_checkpoint,
            save_dir,
            tag,
            client_state=client_state,
            save_latest=save_latest,
            exclude_frozen_parameters=exclude_frozen_parameters,
        )

    def _refuse_unsafe_save(self) -> None:
        rt = self.hier_runtime
        broken = rt.executor.broken if rt is not None else None
        if broken is None and self._step_failed is None:
            return
        what = self._step_failed or f"{type(broken).__name__}"
        first = str(broken).strip().splitlines()[0] if broken is not None and str(broken).strip() else ""
        raise HierUnsafeSaveError(
            f"zeropp_hier: refusing to save a checkpoint on rank {dist.get_rank()}: an earlier step "
            f"ended with {what}{': ' + first if first else ''}. After an interrupt or a communication "
            "error this rank's parameters, gradients and optimizer state may be out of step with its "
            "peers' (a step half done), so a checkpoint could mix steps. Exit, and resume from the "
            "last complete checkpoint (load_checkpoint reads 'latest'); docs/reliability.md"
        )

    def _configure_checkpointing(self):
        super()._configure_checkpointing()
        # DeepSpeed's torch engine loads with weights_only=False: ours loads tensors-only
        # ([Note: tensors-only loading] in checkpoint/safe_load.py). Other engines are refused at save.
        if type(self.checkpoint_engine) is safe_load.TorchCheckpointEngine:
            self.checkpoint_engine.__class__ = safe_load.TensorsOnlyCheckpointEngine
            self.checkpoint_engine.trust_pickles = self.hier_config.checkpoint.trust_pickles

    def _create_zero_checkpoint_files(self, save_dir, tag):
        # DeepSpeed walks every rank of the data-parallel group to find this one (75,264 turns of
        # a Python loop on every rank at every save): the same file, created directly
        if 0 <= self.global_rank < dist.get_world_size(self.optimizer.dp_process_group):
            return self._create_checkpoint_file(save_dir, tag, True)
        return True

    def _get_all_zero_checkpoint_names(self, load_dir, tag, bf16_mode):
        # DeepSpeed names (and stats) every old rank's optimizer file on every rank, though a
        # rank loads only its own unless the checkpoint is elastic: here only the one it loads
        # is named, the others are None, which DeepSpeed's loader reads as "not this rank's"
        # ([Note: one rank's names at load]; the verification before it found every file present)
        if self.zero_elastic_checkpoint() or getattr(self, "_autoep_folding_spec", None) is not None:
            return super()._get_all_zero_checkpoint_names(load_dir, tag, bf16_mode)
        own = dist.get_rank(group=self.optimizer.dp_process_group)
        name = self._get_rank_zero_ckpt_name(load_dir, tag, self.checkpoint_mp_rank, own, bf16_mode)
        if not os.path.exists(name):  # DeepSpeed's older file name
            older = name.replace("_optim_states.pt", "optim_states.pt")
            if os.path.exists(older):
                name = older
        return OwnOnly(self.loaded_checkpoint_dp_world_size, own, name)

    def _get_all_zero_checkpoint_state_dicts(self, zero_ckpt_names):
        """[Note: one rank's names at load]
        DeepSpeed's ZeRO-3 load builds a list of every saved rank's optimizer file name (one
        ``os.path.join`` and, for the older name, one stat each), then walks it, asking the
        process group for this rank's number at each entry, to load the one entry that is this
        rank's; ``load_state_dict`` then reads only ``list[dp_rank]``. At 75,264 ranks that is
        75,264 names and group look-ups on every rank at every load (most of a rank's load time
        in the dry run). Here a non-elastic load (the only kind ZeRO-3 supports) names only this
        rank's file (``OwnOnly``: a sequence of the saved world's length, None but at this rank)
        and loads it through the checkpoint engine (tensors-only) as DeepSpeed would; what is
        loaded is unchanged."""
        if not isinstance(zero_ckpt_names, OwnOnly):
            return super()._get_all_zero_checkpoint_state_dicts(zero_ckpt_names)
        from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

        state = self.checkpoint_engine.load(zero_ckpt_names.name, map_location="cpu")
        # DeepSpeed's check of its own entry (no folded AutoEP here: refuses a folded checkpoint)
        DeepSpeedEngine._validate_autoep_folding_checkpoint_metadata(
            state,
            folding_spec=None,
            family="zero_optimizer_state",
            zero_partition_group="per_family",
            zero_partition_count=None,
        )
        return OwnOnly(len(zero_ckpt_names), zero_ckpt_names.rank, state[OPTIMIZER_STATE_DICT])

    def load_checkpoint(
        self,
        load_dir,
        tag=None,
        *args,
        verify: bool = True,
        trust_pickles: bool | None = None,
        missing_ok: bool = False,
        **kwargs,
    ):
        """DeepSpeed's load, after every rank agrees on the tag and every file is checked
        against the manifest written at save (``verify=False`` skips the manifest, e.g. for a
        checkpoint saved by stock DeepSpeed). Files load tensors-only unless ``trust_pickles``
        (default: ``zeropp_hier.checkpoint.trust_pickles``). No ``latest`` and no ``tag`` is an
        error unless ``missing_ok`` (then nothing is loaded: ``(None, None)``, a fresh start)."""
        trust = self.hier_config.checkpoint.trust_pickles if trust_pickles is None else trust_pickles
        self._quiesce("a checkpoint load")
        tag = checkpoint.verify_for_load(self, load_dir, tag, check=verify, trust_pickles=trust, missing_ok=missing_ok)
        if tag is None:
            return None, None
        with self._guard("load_checkpoint"), safe_load.tensors_only(trust):
            out = super().load_checkpoint(load_dir, tag, *args, **kwargs)
        # Loaded weights replace the primary shards: copies kept from before are stale
        # (ZeRO++ served them after a load, DeepSpeed issue 7606).
        if self.hier_runtime is not None:
            self.hier_runtime.invalidate_shards()
        return out


def model_parallel_refusal(mpu: Any, model: Any, mesh_param: Any = None) -> HierConfigError | None:
    """The error for an ``mpu`` whose data-parallel group is not the world, a pipeline module or
    a model with MoE layers ([Note: data parallelism over the whole world]); None if fine.
    Reads group sizes, so torch.distributed must be initialised when an ``mpu`` is given."""
    if mpu is not None:
        import torch.distributed as dist

        dp = dist.get_world_size(group=mpu.get_data_parallel_group())
        world = dist.get_world_size()
        if dp != world:
            return HierConfigError(
                "initialize(mpu=...)",
                f"data-parallel group of {dp} of {world} ranks",
                MODEL_PARALLEL_FIX + " (an mpu whose data-parallel group is the whole world is fine)",
            )
    if mesh_param is not None and tuple(mesh_param)[1:] not in ((), (1,)):
        return HierConfigError("initialize(mesh_param=...)", mesh_param, MODEL_PARALLEL_FIX)
    if model is not None:
        from deepspeed.pipe import PipelineModule

        if isinstance(model, PipelineModule):
            return HierConfigError("initialize(model=...)", type(model).__name__, MODEL_PARALLEL_FIX)
        from deepspeed.moe.utils import has_moe_layers

        moe, experts = has_moe_layers(model)
        if moe:
            return HierConfigError("initialize(model=...)", f"MoE layers ({experts} experts)", MODEL_PARALLEL_FIX)
    return None


def _world_size_hint() -> int | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    ws = os.environ.get("WORLD_SIZE")
    return int(ws) if ws else None


def initialize(*args, config: Any = None, config_params: Any = None, **kwargs):
    """Drop-in for ``deepspeed.initialize``: same arguments, same return value.

    With an enabled ``zeropp_hier`` section in the config, the engine runs the hierarchical
    stage 3; otherwise this is ``deepspeed.initialize``. The section and the launch environment
    are validated here, before DeepSpeed creates a group or starts a collective; when
    torch.distributed is already up, every rank learns every rank's failure (one small
    all-gather, [Note: agreed local checks]).
    """
    # DeepSpeed's engine imports its Muon optimizer (the optimizer check, ZeRO-3's constructor),
    # whichever optimizer the config names: imported here first, its compiling deferred
    import_deferring_compile(MUON_MODULE)  # [Note: compile on first call]
    ds_config = config if config is not None else config_params
    # DeepSpeed's first parameter, ``args`` (an argparse namespace), positional or by keyword
    ns = args[0] if args else kwargs.get("args")
    ns_config = getattr(ns, "deepspeed_config", None)
    if ds_config is None and ns_config:
        ds_config = ns_config

    def local_checks() -> HierConfig:
        """What can fail on one rank alone (its config file, its environment), agreed across
        ranks when the world exists already ([Note: agreed local checks] in comm/agree.py)."""
        cfg = hier_config_from_ds(_load_ds_config(ds_config, None))
        if not cfg.enabled:
            return cfg
        check_launch_env(os.environ)  # LOCAL_RANK=abc, ... named before DeepSpeed reads them
        refusal = model_parallel_refusal(
            kwargs.get("mpu"), kwargs.get("model", args[1] if len(args) > 1 else None), kwargs.get("mesh_param")
        )
        if refusal is not None:
            raise refusal
        world = _world_size_hint()
        if world is not None and cfg.topology.mode != "auto":  # auto is checked when detected
            topology_for(cfg, world)  # raises HierTopologyError before DeepSpeed starts
        return cfg

    cfg = agree_local("zeropp_hier.initialize's checks (config, launch environment)", local_checks)
    if not cfg.enabled:
        return deepspeed.initialize(*args, config=config, config_params=config_params, **kwargs)
    engine_cls = functools.partial(HierEngine, hier_config=cfg)
    with _rebound(deepspeed, "DeepSpeedEngine", engine_cls):
        return deepspeed.initialize(*args, config=config, config_params=config_params, **kwargs)


class OwnOnly(Sequence):
    """A saved world's list with one entry, this rank's (``rank``); every other entry is None
    ([Note: one rank's names at load]). Deleting this rank's entry (DeepSpeed's serial loading)
    leaves None."""

    def __init__(self, length: int, rank: int, name: Any) -> None:
        if not 0 <= rank < length:
            raise HierCheckpointError(
                f"rank {rank}",
                f"this rank is not one of the {length} ranks that saved the checkpoint",
                "load it on the number of ranks that saved it, or convert it to the universal format",
            )
        self.rank, self.name, self._length = rank, name, length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._length))]
        j = i + self._length if i < 0 else i
        if not 0 <= j < self._length:
            raise IndexError(i)
        return self.name if j == self.rank else None

    def __delitem__(self, i: int) -> None:
        if i == self.rank:
            self.name = None
