"""What one step of training asks of the cluster, as the planner sees it: parameters, tokens per
GCD, widths, the parameter groups gathered per pass, working memory, and what backward need not
gather again ([Note: the turn]). Pure data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    params: float  # M
    tokens_per_gcd: int  # tokens each GCD processes per optimizer step
    weight_bytes: int = 2  # 2 for fp16/bf16 training, 4 for fp32
    gathers_per_pass: int = 1  # parameter groups gathered separately per pass (latency count)
    largest_layer_params: float = 0.0  # for the gathered-layer working memory
    activation_bytes: float = 0.0  # per GCD
    flops_per_token: float | None = None  # default 6 * params (forward + backward)
    reduce_bucket: float = 5e8  # DeepSpeed's reduce_bucket_size (elements)
    # whether DeepSpeed's bucket buffer is resident whole: a GPU's allocator commits it at once,
    # while on a CPU only the pages its gradients are copied into are (at most the model's)
    bucket_committed: bool = True
    residual_bytes: int = 4  # error-feedback residual storage: 4 (fp32) or 2 (numerics.residual_dtype bf16)
    layers: int = 1  # equal layers the kept levels are chosen over ([Note: kept levels])
    # elements the backward's first layers still hold gathered from forward ([Note: the turn])
    kept_at_turn: float = 0.0

    @property
    def backward_share(self) -> float:
        """The part of the model the backward gathers again ([Note: the turn])."""
        return 1.0 - min(self.kept_at_turn, self.params) / self.params if self.params > 0 else 1.0

    @property
    def flops_per_step(self) -> float:
        return (self.flops_per_token or 6.0 * self.params) * self.tokens_per_gcd

    @property
    def optimizer_bytes_per_param(self) -> int:
        # Adam: fp32 m and v, plus an fp32 master copy when the weights are 16-bit
        return 8 + (4 if self.weight_bytes < 4 else 0)


def gpt_workload(
    params: float,
    layers: int,
    d_model: int,
    seq_len: int,
    micro_batch: int,
    weight_bytes: int = 2,
    activation_checkpointing: bool = True,
    vocab: int = 50257,
    prefetch_bucket: float = 0.0,
) -> Workload:
    """A GPT as the planner sees it: 6 parameter groups per layer (ln1, qkv, proj, ln2, fc, out)
    plus embeddings and final norm; activations ~ 34*s*b*d*L bytes (2*s*b*d*L with checkpointing).
    ``prefetch_bucket``: DeepSpeed's ``stage3_prefetch_bucket_size`` (0: no prefetch), which
    decides what backward need not gather again ([Note: the turn]) and how many collectives a
    pass issues ([Note: collectives per pass])."""
    per_layer_act = (2 if activation_checkpointing else 34) * seq_len * micro_batch * d_model
    return Workload(
        params=params,
        tokens_per_gcd=seq_len * micro_batch,
        weight_bytes=weight_bytes,
        # [Note: collectives per pass]
        gathers_per_pass=(layers + 3) if prefetch_bucket > 0 else 6 * layers + 3,
        largest_layer_params=max(4 * d_model * d_model, vocab * d_model),
        activation_bytes=per_layer_act * layers * weight_bytes / 2,
        layers=layers,
        kept_at_turn=min(float(prefetch_bucket), float(params)),
    )


# [Note: the turn]
# Where forward ends and backward begins, DeepSpeed (0.19's PartitionedParameterCoordinator)
# does not release everything forward gathered. Its prefetch walks the recorded trace, which runs
# on into backward; a parameter of backward's first modules that is still gathered is skipped by
# the walk and marked, and a marked parameter is not released after its forward use. So about
# one prefetch bucket (``stage3_prefetch_bucket_size`` elements, when prefetching) of backward's
# first layers is still gathered when backward starts, and backward gathers only the rest.
# Measured on the link-bound benchmark's model (3.68M parameters, 4 layers, bucket 2.36M
# elements): in the steady step, backward gathered the first layer's attention, layer 0 and the
# embedding (1.31M elements) and held the head, layers 3 and 2 and layer 1's MLP (2.36M, the
# bucket). With prefetch off (the job's ``regather``) nothing is held and backward gathers all.
# The planner charges backward ``Workload.backward_share`` of the model; the schedule
# ([Note: step schedule] in planner/schedule.py) runs backward's first layers without a gather.


# [Note: collectives per pass]
# ``gathers_per_pass`` counts the gather collectives of one pass: each pays its hops' latency and
# its messages' framing ([Note: per-message framing] in clusters.py). Without prefetch DeepSpeed
# fetches each module's parameters as the module runs: one call per parameter group, 6 per layer
# plus the embedding, the final norm and the head (the recorded wire_links runs, prefetch off:
# the messages ``comm_stats`` counted are the planner's exactly). With prefetch one DeepSpeed
# call fetches several modules and the runtime makes one job per layer of it ([Note: a job per
# layer] in deepspeed/inflight.py): at least one per layer and pass, plus the embedding, the final
# norm and the head, which is what the planner counts. The recorded 8 x 1 x 2 and 2 x 4 x 2 runs
# (base shape, prefetch 2.36M elements) issued 13 forward gathers per step where this counts 7
# (``comm_stats``' message counts: 240 node messages per flat gather at 8 x 1 x 2, 60 at
# 2 x 4 x 2, and 7 gradient buckets of 112 and 16): where DeepSpeed's prefetch splits a layer
# over two calls the runtime issues more.
