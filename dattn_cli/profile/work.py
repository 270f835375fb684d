"""The work a profile setting repeats: one module and its seeded inputs, one call, and its timing."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..runtime.measure import quantile
from ..runtime.point import call_seconds
from ..workload.build import build_module, input_shape, make_inputs
from ..workload.problem import Problem
from .report import TimeStats


class Workload:
    """One module plus its inputs, built from the seed so every setting sees the same numbers."""

    def __init__(self, problem: Problem, seed: int, dtype: torch.dtype, device: torch.device, caches: bool):
        cuda_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda_devices):  # seed locally; the caller's RNG state is kept
            torch.manual_seed(seed)
            self.module: nn.Module = build_module(
                problem, device=device, dtype=dtype, use_pattern_cache=caches, enable_memory_pool=caches
            )
            # multihead: x three times (self-attention, the fused projection path); core: q, k, v
            self.inputs: tuple[torch.Tensor, ...] = make_inputs(problem, dtype=dtype)
            fwdbwd = problem.mode == "fwdbwd"
            self.grad_out = torch.randn(input_shape(problem), dtype=dtype, device=device) if fwdbwd else None
        self.multihead = problem.spec.kind == "multihead"
        self.causal = problem.causal
        self.leaves = [t for t in {id(t): t for t in self.inputs}.values() if t.requires_grad]

    def step(self) -> None:
        if self.grad_out is None:
            with torch.no_grad():
                self._forward()
            return
        for t in self.leaves:
            t.grad = None
        self.module.zero_grad(set_to_none=True)
        self._forward().backward(self.grad_out)

    def _forward(self) -> torch.Tensor:
        out = self.module(*self.inputs, is_causal=self.causal)
        return out[0] if self.multihead else out

    @property
    def core(self) -> nn.Module:
        return self.module.attention if self.multihead else self.module

    def backend(self) -> str | None:
        last = getattr(self.core, "last_backend", None)
        return last[0] if last else None


def time_iterations(step: Callable[[], None], iterations: int, device: torch.device) -> TimeStats:
    """`iterations` timed calls of `step`, each measured as bench measures one (runtime.point.call_seconds)."""
    samples = [call_seconds(step, device) * 1e3 for _ in range(iterations)]
    ordered = sorted(samples)
    return TimeStats(
        median_ms=quantile(ordered, 0.5),
        p10_ms=quantile(ordered, 0.1),
        p90_ms=quantile(ordered, 0.9),
        samples_ms=samples,
    )
