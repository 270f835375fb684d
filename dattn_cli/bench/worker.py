"""Measure one point in an isolated worker process.

The parent forks workers from a forkserver that has torch imported but has run nothing, so a worker
starts in milliseconds, and an OOM or crash in it becomes a row instead of ending the sweep. On CPU the
worker caps its own address space (RLIMIT_AS) so an allocation beyond --max-memory fails inside torch
(status=oom) long before the kernel's OOM killer would act; the parent also watches the worker's RSS
and its time budget, and kills it if either is exceeded. Once the memory call has fitted, the timed
calls may use up to twice --max-memory (cap_address_space, and the parent's RSS watch): under glibc's
usual thresholds its heap keeps freed chunks, which the measured peak rightly leaves out.

CPU peak memory: the worker tells glibc, before it builds anything, to give every allocation over
64 KiB its own mapping and return it on free (measure.return_freed_memory); after the warm-up the peak
RSS is reset and one more call runs. Its peak RSS minus the worker's RSS right after start-up is
everything the point holds at its peak (inputs, weights, caches included), free of what glibc would
otherwise keep from earlier calls. Set only after other calls, the setting comes too late: large chunks
already freed into the heap are reused, never returned, and their history added 5-25% of noise. The
timed calls come last, under glibc's steady-state setting (measure.reuse_freed_memory): a mapping per
allocation costs page faults on every call (bf16 autocast blocks ran 30-45% slower under it).
GPU: torch.cuda.max_memory_allocated after a reset, plus NVML's device-used figure.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import statistics
import time
import traceback
from typing import Any, Callable

from ..runtime.measure import (peak_rss_bytes, quantile, reset_peak_rss, return_freed_memory, reuse_freed_memory, rss_bytes,
                       vm_bytes)
from .config import BenchConfig
from .rows import BenchRow

CPU_MEM_METHOD = ("peak RSS of one call after the warm-up, freed memory returned to the OS (glibc mmap threshold "
                  "64 KiB from worker start-up), above the isolated worker's RSS after start-up, inputs included")
CPU_MEM_METHOD_FALLBACK = "peak RSS (ru_maxrss) of the isolated worker above its RSS after start-up, inputs included"
GPU_MEM_METHOD = "torch.cuda.max_memory_allocated after reset_peak_memory_stats (allocator view)"
RLIMIT_SLACK = 512 * 2**20
TIMING_HEADROOM = 2  # x --max-memory for the timed calls on CPU (see the module docstring)
_CONTEXT: Any = None


def dense_pairs(batch: int, heads: int, n: int, causal: bool) -> int:
    return batch * heads * (n * (n + 1) // 2 if causal else n * n)


def attended_pairs_for(impl: str, cfg: BenchConfig, n: int) -> int:
    """P of the FLOP convention: the pairs this implementation actually computes."""
    from ..kernels.pattern import attended_pairs, build_blocks

    if impl in ("sdpa", "math", "flash", "reference"):
        return dense_pairs(cfg.batch, cfg.heads, n, cfg.causal)
    fields = cfg.pattern_fields(impl, n)
    if fields["pattern"] is not None:
        return round(fields["element_density"] * n * n) * cfg.batch * cfg.heads
    blocks = build_blocks(n, cfg.heads, cfg.segment_lengths, cfg.dilation_rates, cfg.semantics)
    return attended_pairs(cfg.batch, blocks, cfg.causal)


def flops_for(impl: str, cfg: BenchConfig, n: int) -> float:
    """Attention: 4·D·P (fwd+bwd 3.5x). Layers add their matmuls (plan.layers.linear_flops: 2·(tokens)·(in·out)
    per linear layer, q/k/v/out projections and the MLP; the LM head for a model; fwd+bwd 3x)."""
    fwd = 4.0 * cfg.head_dim * attended_pairs_for(impl, cfg, n)
    total = fwd * (3.5 if cfg.mode == "fwdbwd" else 1.0)
    if cfg.target != "attention":
        from ..plan.layers import linear_flops
        from .estimate import layer_shape

        shape = layer_shape(impl, cfg, n)
        total = shape.layers * total + linear_flops(shape)
    return total


def _build_layer(impl: str, cfg: BenchConfig, n: int):
    """(make_inputs, run, module) for --target layer|model. A model's fwdbwd step is a training step:
    forward, loss, backward and AdamW step (run returns None; it does the backward itself)."""
    import contextlib

    import torch

    from ..models.longnet import DilatedTransformerBlock, LongNetLM

    dtype, device = getattr(torch, cfg.dtype), torch.device(cfg.device)
    grad = cfg.mode == "fwdbwd"
    options = dict(attention=impl, mlp_ratio=cfg.mlp_ratio, device=device, dtype=dtype, **_attention_options(impl, cfg))
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.amp)

    def autocast():
        return torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext()

    if cfg.target == "layer":
        block = DilatedTransformerBlock(cfg.width, cfg.heads, **options)

        def run_layer(x):
            with autocast():
                if cfg.checkpointing and grad:
                    return torch.utils.checkpoint.checkpoint(block, x, cfg.causal, use_reentrant=False)
                return block(x, cfg.causal)

        def x1():
            return (torch.randn(cfg.batch, n, cfg.width, dtype=dtype, device=device, requires_grad=grad),)
        return x1, run_layer, block

    model = LongNetLM(cfg.vocab_size, cfg.width, cfg.heads, cfg.layers, checkpointing=cfg.checkpointing, **options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if grad else None

    def tokens():
        return (torch.randint(0, cfg.vocab_size, (cfg.batch, n + 1), device=device),)

    def run_model(t):
        with autocast():
            loss = model.loss(t[:, :-1], t[:, 1:])
        if optimizer is None:
            return loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return None
    return tokens, run_model, model


def _attention_options(impl: str, cfg: BenchConfig) -> dict:
    """Constructor keywords of a registered implementation for this configuration; segment_lengths and
    dilation_rates always present (None where a block pattern takes none)."""
    from ..kernels import REGISTRY

    if not REGISTRY[impl].block_sparse:
        return {"segment_lengths": cfg.segment_lengths, "dilation_rates": cfg.dilation_rates, "semantics": cfg.semantics}
    options = cfg.block_options(cfg.densities[0] if cfg.densities else None)
    return {"segment_lengths": None, "dilation_rates": None, **options, "executor": cfg.executor}


def _build(impl: str, cfg: BenchConfig, n: int, length: int | None = None):
    """(make_inputs, run, module): run(*inputs) returns the output tensor; inputs hold `length` positions
    (this rank's shard of n; all of n on one process); module is None for baselines."""
    import torch
    import torch.nn.functional as F

    from ..kernels import REGISTRY
    from ..kernels.reference import dilated_attention_reference

    if cfg.target != "attention":
        return _build_layer(impl, cfg, n)
    dtype = getattr(torch, cfg.dtype)
    device = torch.device(cfg.device)
    grad = cfg.mode == "fwdbwd"
    length = n if length is None else length
    shape = (cfg.batch, length, cfg.heads, cfg.head_dim)

    def qkv():
        return tuple(torch.randn(shape, dtype=dtype, device=device, requires_grad=grad) for _ in range(3))

    t = lambda x: x.transpose(1, 2)  # noqa: E731
    if impl == "sdpa":
        return qkv, lambda q, k, v: t(F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=cfg.causal)), None
    if impl == "math":
        def math_attention(q, k, v):
            scores = torch.matmul(t(q), t(k).transpose(-1, -2)) * cfg.head_dim**-0.5
            if cfg.causal:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=device).triu(1), float("-inf"))
            return t(torch.matmul(torch.softmax(scores, dim=-1), t(v)))
        return qkv, math_attention, None
    if impl == "flash":
        from flash_attn import flash_attn_func

        return qkv, lambda q, k, v: flash_attn_func(q, k, v, causal=cfg.causal), None
    if impl == "reference":
        return qkv, lambda q, k, v: dilated_attention_reference(
            q, k, v, cfg.segment_lengths, cfg.dilation_rates, cfg.causal, cfg.semantics)[0], None
    entry = REGISTRY.get(impl)
    if entry is None:
        raise ValueError(f"--impl {impl!r} is not registered and not a baseline")
    options = _attention_options(impl, cfg)
    if entry.kind == "multihead":
        embed = cfg.heads * cfg.head_dim
        module = entry.cls(embed, cfg.heads, **options, device=device, dtype=dtype)

        def x3():
            x = torch.randn(cfg.batch, length, embed, dtype=dtype, device=device, requires_grad=grad)
            return x, x, x
        return x3, lambda q, k, v: module(q, k, v, is_causal=cfg.causal)[0], module
    module = entry.cls(options.pop("segment_lengths"), options.pop("dilation_rates"), **options)
    return qkv, lambda q, k, v: module(q, k, v, is_causal=cfg.causal), module


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return "can't allocate memory" in text or "out of memory" in text or "cannot allocate memory" in text


def measure_point(cfg: BenchConfig, impl: str, n: int, start_rss: int | None = None, group: Any = None) -> dict:
    """Run one point in this process; returns the row fields it measured.

    With `group` (a rank of an initialised process group), this process holds its shard of n, every
    timed call starts after a barrier, and the ranks agree on skipping a point that would run too long.
    """
    import torch

    start_rss = rss_bytes() if start_rss is None else start_rss
    cuda = cfg.device.startswith("cuda")
    world = 1
    if group is not None:
        import torch.distributed as dist

        world = dist.get_world_size(group)
    returns_memory = not cuda and return_freed_memory()  # before the first allocation: see the module docstring
    torch.manual_seed(cfg.seed)
    make_inputs, run, module = _build(impl, cfg, n, n // world)

    def step() -> float:
        inputs = make_inputs()  # fresh random inputs for every call, outside the timed region
        if group is not None:
            dist.barrier(group)
        if cuda:
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        t0 = time.perf_counter()
        if cfg.mode == "fwdbwd":
            out = run(*inputs)
            if out is not None:  # None: run took a whole training step itself
                out.backward(torch.ones_like(out))
        else:
            with torch.no_grad():
                run(*inputs)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            return begin.elapsed_time(end) / 1e3
        return time.perf_counter() - t0

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    first = step()
    for _ in range(cfg.warmup - 1):
        step()
    untimed = 0 if cuda else 2  # CPU: the memory call and the heap-settling call below
    projected = time.perf_counter() - began + first * (cfg.repeat + untimed)
    if group is not None:  # every rank must take the same branch, or the others wait in a barrier
        worst = torch.tensor([projected], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
        projected = float(worst.item())
    if projected > cfg.max_seconds:
        return {"status": "skipped", "reason": f"time: one call took {first:.2f} s, so {cfg.repeat} repeats would "
                f"exceed --max-seconds {cfg.max_seconds:g}"}
    memory: dict[str, Any] = {}
    if not cuda:
        exact = returns_memory and return_freed_memory() and reset_peak_rss()
        if exact:
            step()
        memory = dict(peak_mem_bytes=max(0, peak_rss_bytes() - start_rss),
                      mem_method=CPU_MEM_METHOD if exact else CPU_MEM_METHOD_FALLBACK)
        if returns_memory and reuse_freed_memory():
            if _BASE_VM is not None:  # capped by the worker (not when measure_point runs in a caller's process)
                cap_address_space(cfg, TIMING_HEADROOM)
            step()  # untimed: the heap grows to its steady state under the timing setting
    calls_before = module.comm_stats() if hasattr(module, "comm_stats") else None
    times = sorted(step() for _ in range(cfg.repeat))
    median = statistics.median(times)
    result = {
        "status": "ok", "time_ms": median * 1e3, "repeats": len(times),
        "time_ms_p10": quantile(times, 0.1) * 1e3, "time_ms_p90": quantile(times, 0.9) * 1e3,
        "tokens_per_s": cfg.batch * n / median,
    }
    flops = flops_for(impl, cfg, n)
    result.update(flops=flops, tflops=flops / median / 1e12)
    if cfg.target != "attention":
        result["params"] = sum(p.numel() for p in module.parameters())
    if calls_before is not None:
        after = module.comm_stats()
        for way in ("sent", "received"):
            moved = sum(after[f"{phase}_bytes_{way}"] - calls_before[f"{phase}_bytes_{way}"] for phase in ("forward", "backward"))
            result[f"comm_bytes_{way}"] = moved // len(times)
    if cuda:
        memory = dict(peak_mem_bytes=torch.cuda.max_memory_allocated(), mem_method=GPU_MEM_METHOD,
                      nvml_used_bytes=_nvml_used(torch.cuda.current_device()))
    result.update(memory)
    return result


_BASE_VM: int | None = None


def cap_address_space(cfg: BenchConfig, headroom: float = 1.0) -> None:
    """Cap this worker's address space at its size when first called plus headroom x --max-memory (+ slack)."""
    global _BASE_VM
    if _BASE_VM is None:
        _BASE_VM = vm_bytes()
    limit = int(_BASE_VM + headroom * cfg.max_memory + RLIMIT_SLACK)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _nvml_used(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML absent or unusable: the column stays empty, the row stays valid
        return None


def _child(conn, cfg_data: dict, impl: str, n: int) -> None:
    start_rss = rss_bytes()
    cfg = BenchConfig.model_validate(cfg_data)
    if not cfg.device.startswith("cuda"):
        cap_address_space(cfg)
    try:
        result = measure_point(cfg, impl, n, start_rss)
    except BaseException as exc:  # every failure becomes a row; the sweep goes on
        try:
            oom = _is_oom(exc)
        except Exception:
            oom = False
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        result = {"status": "oom" if oom else "error", "error": message,
                  "reason": "out of memory" if oom else "exception in worker"}
        if not oom and os.environ.get("DATTN_DEBUG"):
            traceback.print_exc()
    conn.send(result)
    conn.close()


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "dattn_cli.kernels", "dattn_cli.bench.worker"])
    return _CONTEXT


def run_isolated(cfg: BenchConfig, impl: str, n: int, child: Callable = _child) -> dict:
    """Measure one point in a fresh worker; OOM, crash or time-out become a result, never an exception."""
    ctx = _context()
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(sender, cfg.model_dump(), impl, n), daemon=True)
    proc.start()
    sender.close()
    deadline = time.monotonic() + cfg.max_seconds + 30.0
    base_rss = None
    result = None
    try:
        while result is None:
            if receiver.poll(0.05):
                try:
                    result = receiver.recv()
                except EOFError:
                    proc.join(5)
                    result = _died(proc.exitcode)
                break
            if not proc.is_alive():
                proc.join()
                result = _died(proc.exitcode)
                break
            try:
                rss = rss_bytes(proc.pid)
            except (OSError, IndexError):
                continue
            base_rss = rss if base_rss is None else min(base_rss, rss)
            if not cfg.device.startswith("cuda") and rss - base_rss > TIMING_HEADROOM * cfg.max_memory + RLIMIT_SLACK:
                proc.kill()
                result = {"status": "oom", "reason": "out of memory",
                          "error": f"worker RSS grew {(rss - base_rss) / 2**30:.2f} GiB, over {TIMING_HEADROOM}x "
                          "--max-memory; killed"}
            elif time.monotonic() > deadline:
                proc.kill()
                result = {"status": "skipped", "reason": f"time: point ran past --max-seconds {cfg.max_seconds:g}; killed"}
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        receiver.close()
    return result


def _died(exitcode: int | None) -> dict:
    if exitcode is not None and exitcode < 0 and -exitcode == 9:
        return {"status": "oom", "reason": "out of memory", "error": "worker killed by SIGKILL (likely the OOM killer)"}
    return {"status": "error", "reason": "worker crashed", "error": f"worker exited with code {exitcode} and sent no result"}


def measure_rank(rank: int, world: int, cfg_data: dict, impl: str, n: int) -> dict:
    """One rank of a distributed point (run by run_distributed): memory above this rank's RSS after the
    process group is up, address space capped like a single-process worker."""
    import torch
    import torch.distributed as dist

    cfg = BenchConfig.model_validate(cfg_data)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # as torchrun would: no oversubscribed cores
    if cfg.device.startswith("cuda"):
        torch.cuda.set_device(rank % torch.cuda.device_count())
        cfg = cfg.model_copy(update={"device": f"cuda:{torch.cuda.current_device()}"})
    else:
        cap_address_space(cfg)
    return measure_point(cfg, impl, n, rss_bytes(), group=dist.group.WORLD)


def run_distributed_point(cfg: BenchConfig, impl: str, n: int) -> dict:
    """Measure one point on cfg.nproc ranks; a failing, OOM or stuck rank becomes a row naming the rank."""
    from ..runtime.launch import DistributedError, run_distributed
    from ..verify.distributed import shard_problem
    from ..verify.cases import VerifyCase

    case = VerifyCase(name="bench", batch=cfg.batch, seq_len=n, heads=cfg.heads, head_dim=cfg.head_dim,
                      segment_lengths=cfg.segment_lengths, dilation_rates=cfg.dilation_rates)
    problem = shard_problem(case, cfg.nproc, impl)
    if problem:
        return {"status": "skipped", "reason": f"cannot shard: {problem}"}
    backend = "nccl" if cfg.device.startswith("cuda") else "gloo"
    try:
        per_rank = run_distributed(measure_rank, cfg.nproc, cfg.model_dump(), impl, n, backend=backend,
                                   timeout_s=cfg.dist_timeout + cfg.max_seconds)
    except DistributedError as exc:
        text = str(exc)
        oom = any(s in text.lower() for s in ("memoryerror", "out of memory", "can't allocate", "cannot allocate", "code -9"))
        return {"status": "oom" if oom else "error", "error": text[:500],
                "reason": "out of memory" if oom else "a rank failed"}
    bad = [r for r in per_rank if r["status"] != "ok"]
    if bad:
        return bad[0]
    slowest = max(per_rank, key=lambda r: r["time_ms"])
    result = dict(slowest)
    result["peak_mem_bytes_per_rank"] = [r["peak_mem_bytes"] for r in per_rank]
    result["peak_mem_bytes"] = max(result["peak_mem_bytes_per_rank"])
    for way in ("sent", "received"):
        values = [r.get(f"comm_bytes_{way}") for r in per_rank]
        result[f"comm_bytes_{way}"] = max(values) if None not in values else None
    result["mem_method"] = (result.get("mem_method") or "") + "; per rank, the largest over ranks (all in peak_mem_bytes_per_rank)"
    return result


def make_row(cfg: BenchConfig, impl: str, n: int, result: dict, predicted: int | None) -> BenchRow:
    return BenchRow(impl=impl, seq_len=n, predicted_mem_bytes=predicted, **cfg.point_key(),
                    **cfg.pattern_fields(impl, n), **result)
