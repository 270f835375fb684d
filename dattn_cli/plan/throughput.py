"""A model's training throughput at a global batch (`plan --global-batch-tokens G`): tokens/s per device and MFU
in two conventions.

* G tokens an optimizer step over R = devices / (tp x sp) replicas of B x N tokens each: A = ceil(G / (R·B·N))
  micro-steps a replica, each the plan's step less its optimizer step, which runs once: step(G) = A x (t - t_opt)
  + t_opt; tokens/s per device = A·R·B·N / (step(G) x devices). Without G, one micro-step a step (A = 1).
* MFU: the model FLOPs a device does per step over step(G) x the compute dtype's dense peak (bf16's under --fp8,
  as torchtitan reports it). Model FLOPs are causal-aware and count no recomputation: the plan's FLOPs (the
  attention pairs a causal mask keeps, docs/semantics.md; 2·T per matmul weight x 3 with the backward).
* MFU in Megatron's convention, the one NeMo, Megatron-Bridge and ALST report (Narayanan et al. 2021,
  arXiv:2104.04473, Appendix: 96·B·s·l·h²(1 + s/6h + V/16lh) with activation recomputation): per token
  L x [(3 + r_lin)·2·P_b + (3 + r_att)·4·N·H·D] + 3·2·E·V, the attention as the full N x N square whatever the
  mask, the recomputed forward counted (r = 1 for full recompute; selective: the recomputed share), P_b a block's
  matmul weights. NeMo's own formula (nemo/utils/flops_formulas.py) is this with r = 0. A convention for dense
  attention: None for dattn's dilated or block-sparse attention, whose pairs are not the N x N square.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from ..workload.architecture import block_matmul_parameters
from ..workload.problem import Problem
from .layers import recompute_factors
from .profiles import HardwareProfile


class Throughput(BaseModel):
    global_batch_tokens: int  # tokens an optimizer step (A x replicas x B x N)
    accumulation: int  # micro-steps a replica runs per optimizer step
    step_s: float  # one optimizer step at that global batch
    tokens_per_s_per_device: float
    mfu: float  # causal-aware model FLOPs, no recompute
    mfu_megatron: float | None  # Megatron's convention: full attention square, recompute counted (dense only)
    model_flops_per_token: float
    megatron_flops_per_token: float | None


def megatron_flops_per_token(s: Problem, recompute: str) -> float:
    """Megatron's training FLOPs per token (module docstring)."""
    r_att = r_lin = 0.0
    if s.mode == "fwdbwd":
        a, b = recompute_factors(s.model_copy(update={"checkpointing": recompute == "full"}), recompute == "selective")
        r_att, r_lin = 3.5 * (a - 1), 3 * (b - 1)
    passes = 3 if s.mode == "fwdbwd" else 1
    block = (passes + r_lin) * 2 * block_matmul_parameters(s) + (passes + r_att) * 4 * s.seq_len * s.attention_width
    return s.layers * block + passes * 2 * s.width * s.vocab_size


def throughput(s: Problem, profile: HardwareProfile, plan_time, training) -> Throughput:
    """Tokens/s per device and MFU of a model's training step at `training.global_batch_tokens` (module docstring);
    `plan_time`: its StepTime."""
    replicas, global_batch_tokens = training.data_parallel, training.global_batch_tokens
    micro = s.batch * s.seq_len
    accumulation = max(1, math.ceil(global_batch_tokens / (replicas * micro))) if global_batch_tokens else 1
    step = accumulation * (plan_time.total_s - plan_time.optimizer_s) + plan_time.optimizer_s
    tokens = accumulation * replicas * micro
    peak = profile.required_peak(s.compute_dtype)
    model_flops = plan_time.flops * accumulation  # a device's useful FLOPs over the step
    dense = s.spec.strategy == "dense"
    megatron = (
        megatron_flops_per_token(s, training.recompute or ("full" if s.checkpointing else "none")) if dense else None
    )
    return Throughput(
        global_batch_tokens=tokens,
        accumulation=accumulation,
        step_s=step,
        tokens_per_s_per_device=tokens / (step * training.devices),
        mfu=model_flops / (step * peak),
        mfu_megatron=megatron * tokens / training.devices / (step * peak) if megatron else None,
        model_flops_per_token=model_flops * training.devices / tokens,
        megatron_flops_per_token=megatron,
    )
