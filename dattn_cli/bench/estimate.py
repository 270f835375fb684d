"""Predicted peak memory of a bench point, from the planner's memory model (plan/memory.py).

Filled into every row as `predicted_mem_bytes`, and used to skip points that clearly cannot fit
before running them. CPU rows are measured as RSS above the worker's start-up RSS, so the CPU host
profile's fixed runtime cost is included; CUDA rows are measured by the caching allocator, which does
not see the CUDA context, so none is added.
"""

from __future__ import annotations

from functools import lru_cache

from .config import BenchConfig


@lru_cache(maxsize=None)
def _cpu_fixed_bytes(mode: str) -> int:
    """The CPU host profile's fixed runtime costs, read once per process rather than once per point."""
    from ..plan.model import framework_bytes
    from ..plan.profiles import load_profile

    return framework_bytes(load_profile("cpu-host"), mode)


def estimate_peak_bytes(impl: str, cfg: BenchConfig, seq_len: int) -> int | None:
    """None where the planner has no model (block-sparse patterns): the row says so by leaving it empty."""
    from ..kernels import REGISTRY
    from ..plan.memory import Shape, estimate_memory, strategy_for

    if impl in REGISTRY and REGISTRY[impl].block_sparse:
        return None
    cpu = not cfg.device.startswith("cuda")
    if cfg.target != "attention":
        from ..plan.layers import layer_memory

        try:
            return layer_memory(layer_shape(impl, cfg, seq_len), _cpu_fixed_bytes(cfg.mode) if cpu else 0,
                                "cpu" if cpu else "cuda").total
        except ValueError:
            return None

    if impl == "reference":  # float64 copies of q, k, v, out (and grads) plus its bounded block of scores
        x64 = cfg.batch * seq_len * cfg.heads * cfg.head_dim * 8
        return int((16 if cfg.mode == "fwdbwd" else 8) * x64 + 64 * 2**20 * (3 if cfg.mode == "fwdbwd" else 1))
    framework = _cpu_fixed_bytes(cfg.mode) if cpu else 0
    shape = Shape(impl=impl, seq_len=seq_len, batch=cfg.batch, heads=cfg.heads, head_dim=cfg.head_dim,
                  segment_lengths=cfg.segment_lengths, dilation_rates=cfg.dilation_rates, semantics=cfg.semantics,
                  causal=cfg.causal, dtype=cfg.dtype, mode=cfg.mode, world_size=cfg.nproc,
                  strategy=strategy_for(impl, cfg.nproc))
    try:
        return estimate_memory(shape, framework, "cpu" if cpu else "cuda").total
    except ValueError:  # a shape the model cannot plan (e.g. unaligned shards): the point decides itself
        return 0


def layer_shape(impl: str, cfg: BenchConfig, seq_len: int):
    """The planner's LayerShape of a --target layer|model point."""
    from ..plan.layers import LayerShape

    return LayerShape(impl=impl, seq_len=seq_len, batch=cfg.batch, heads=cfg.heads, embed_dim=cfg.width,
                      segment_lengths=cfg.segment_lengths, dilation_rates=cfg.dilation_rates, semantics=cfg.semantics,
                      causal=cfg.causal, dtype=cfg.dtype, mode=cfg.mode, target=cfg.target, layers=cfg.layers,
                      vocab_size=cfg.vocab_size, mlp_ratio=cfg.mlp_ratio, checkpointing=cfg.checkpointing, amp=cfg.amp)
