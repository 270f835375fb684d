"""plan --tensor-parallel T: Megatron-LM's tensor parallelism with sequence parallelism (Shoeybi et al. 2019,
arXiv:1909.08053; Korthikanti et al. 2022, arXiv:2205.05198) for a named model's decoder layers.

Each block's q, k, v and gate/up (fc1) are column-parallel and o and down (fc2) row-parallel: every matmul weight
is split over the T devices, as are the embedding and the head (vocabulary-parallel); the norms are replicated.
Each device computes H/T query heads and H_kv/T kv heads over the whole local sequence. With sequence parallelism
the norms, residuals and dropout run on N/T positions, so every activation a block saves is divided by T
(Korthikanti §4.2.2: sbh(34 + 5as/h)/t per layer): this planner counts a device's saved set as the block's on
N/T positions (the attention's on H/T heads over N is the same bytes for the dense kernels it allows), the
vocabulary-parallel logits as T_tokens x V/T, plus the all-gathered input of the column-parallel matmuls, N x E
in the compute dtype, while each runs. The collectives are plan/collectives.py's `tensor_parallel`.

Placement: tensor parallel is innermost (consecutive ranks, inside a node while T <= devices per node), then
sequence parallel, then data parallel; ZeRO shards over the dp x sp devices that hold the same tensor shard.
Refused in one line: T not dividing the heads, the kv heads or N / sp; an attention other than the dense kernels
(dattn's dilated kinds keep segment-wise buffers, math its N^2 scores: neither divides by T like this);
LongNet's own block (no named model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..workload.architecture import block_matmul_parameters, norm_parameters
from ..workload.problem import Problem

if TYPE_CHECKING:
    from .profiles import HardwareProfile


def check(s: Problem, tp: int, sp: int) -> None:
    if tp == 1:
        return
    if s.architecture is None:
        raise ValueError("--tensor-parallel splits a named model's projections: give --model or --model-config")
    if s.spec.memory_model != "dense":
        raise ValueError(
            f"--tensor-parallel with --impl {s.impl} is not modelled: give a dense attention kernel (sdpa, the "
            "default, flash, flash4 or cudnn)"
        )
    for what, count in (("query heads", s.heads), ("kv heads", s.kv_head_count)):
        if count % tp:
            raise ValueError(f"--tensor-parallel {tp} does not divide the model's {count} {what}: use a divisor")
    if (s.seq_len // sp) % tp or s.seq_len % sp:
        raise ValueError(
            f"--tensor-parallel {tp}: N / sp = {s.seq_len / sp:g} positions do not split into {tp} sequence shards"
        )


def device_parameters(s: Problem, total: int, tp: int) -> float:
    """Parameters one device holds of a model of `total`: all but the (replicated) norms divided by T."""
    norms = (2 * s.layers + 1) * norm_parameters(s)
    return (total - norms) / tp + norms


def block_unit(s: Problem, block: int, tp: int) -> tuple[float, float]:
    """(one block's parameters on a device, its matmuls' share of them) under T: all but its two norms split, as
    device_parameters counts them."""
    norms = 2 * norm_parameters(s)
    return (block - norms) / tp + norms, block_matmul_parameters(s) / tp


def token_share(s: Problem, tp: int) -> Problem:
    """The problem whose activations are one device's: N / T positions (module docstring)."""
    return s if tp == 1 else s.model_copy(update={"seq_len": s.seq_len // tp})


def head_share(s: Problem, tp: int) -> Problem:
    """The problem whose attention is one device's: H / T and H_kv / T heads over all N positions."""
    if tp == 1:
        return s
    return s.model_copy(update={"heads": s.heads // tp, "kv_heads": s.kv_head_count // tp})


def outer(profile: HardwareProfile, tp: int) -> HardwareProfile:
    """The profile as a group outside the tensor-parallel one sees it: its ranks are T apart, so a node holds
    devices_per_node / T of them (a sequence-parallel group of C crosses nodes once C x T exceeds a node)."""
    return (
        profile if tp == 1 else profile.model_copy(update={"devices_per_node": max(1, profile.devices_per_node // tp)})
    )
