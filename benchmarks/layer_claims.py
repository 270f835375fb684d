"""Layer-level claims, measured: what checkpointing, mixed precision and dilation buy in a real layer.

1. block: one DilatedTransformerBlock of the ~125M LongNetLM (E=768, 12 heads, MLP 4x, causal, fp32
   weights), forward+backward at N = 2K..16K, plain / --checkpointing / --amp bf16 / both, and the same
   block with dense causal attention (one segment longer than N, r=1) -> time and peak memory side by side.
2. model: the ~125M LongNetLM (E=768, 12 heads, 12 layers, vocabulary 50,304) training step (forward,
   loss, backward, AdamW) under a memory cap, `--until-oom` for each option: the longest trainable N on
   this machine, next to `dattn plan --target model --max-seq --memory CAP`.
3. the planner on a GPU profile: the longest N of that model per option on an 80 GB H100, and the
   breakdown at N = 1M (what the "125M model on 1M tokens on 80 GB" claim would need).

    python benchmarks/layer_claims.py [--seq-lens 2k,4k,8k,16k] [--cap 4GiB] [--skip-block] [--skip-model]

Every point is an ordinary `dattn bench` point (one isolated worker each); rows go to
benchmarks/layer_cpu.jsonl and benchmarks/model_until_oom_cpu.jsonl (resumed if present).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dattn_cli.bench import BenchConfig, parse_seq_lens, run_sweep
from dattn_cli.bench.config import parse_size
from dattn_cli.bench.rows import read_rows
from dattn_cli.plan import model as planner
from dattn_cli.plan.check import shape_of
from dattn_cli.plan.layers import LayerShape
from dattn_cli.plan.profiles import load_profile

IMPL = "ImprovedMultiheadDilatedAttention"
SEGMENTS, DILATIONS = [2048, 4096, 8192], [1, 2, 4]
DENSE = dict(segment_lengths=[1 << 20], dilation_rates=[1])  # one segment longer than any N: dense causal
OPTIONS = {"plain": {}, "checkpointing": {"checkpointing": True}, "amp bf16": {"amp": "bf16"},
           "checkpointing + amp bf16": {"checkpointing": True, "amp": "bf16"}}
MODEL = dict(heads=12, head_dim=64, layers=12, vocab_size=50304)


def label(row) -> str:
    options = [o for o in ("checkpointing" if row.checkpointing else "", f"amp {row.amp}" if row.amp else "") if o]
    attention = "dense" if row.segments == DENSE["segment_lengths"] else "dilated"
    return f"{attention}, {' + '.join(options) or 'plain'}"


def block_part(seq_lens: list[int], out: Path, command: list[str]) -> None:
    common = dict(impls=[IMPL], seq_lens=seq_lens, mode="fwdbwd", heads=12, head_dim=64, causal=True, target="layer",
                  warmup=1, repeat=3, max_memory=16 * 2**30, max_seconds=900.0)
    configs = [BenchConfig(segment_lengths=SEGMENTS, dilation_rates=DILATIONS, **common, **o) for o in OPTIONS.values()]
    configs.append(BenchConfig(**DENSE, **common))
    for cfg in configs:
        run_sweep(cfg, out=out, resume=True, command=command,
                  on_row=lambda r: print(f"  block {label(r)} N={r.seq_len}: {r.status} {r.time_ms} ms", flush=True))
    rows = [r for r in read_rows(out) if r.status == "ok" and r.target == "layer"]
    profile = load_profile("cpu-host")
    print("\nblock E=768 H=12, fwd+bwd, causal, CPU; ratios against the plain dilated block at the same N")
    for n in seq_lens:
        at = {label(r): r for r in rows if r.seq_len == n}
        base = at.get("dilated, plain")
        for name, r in at.items():
            predicted = planner.plan(shape_of(r), profile).memory.total
            ratio = f" = {r.time_ms / base.time_ms:.2f}x time, {r.peak_mem_bytes / base.peak_mem_bytes:.2f}x memory" if base else ""
            print(f"  N={n:>6} {name:<36} {r.time_ms:9.1f} ms {r.peak_mem_bytes / 2**20:8.1f} MiB"
                  f" (plan {predicted / 2**20:7.1f} MiB){ratio}")


def model_part(cap: int, out: Path, command: list[str]) -> None:
    common = dict(impls=[IMPL], until_oom=True, mode="fwdbwd", target="model", segment_lengths=SEGMENTS,
                  dilation_rates=DILATIONS, warmup=1, repeat=1, max_memory=cap, max_seconds=900.0, **MODEL)
    cpu = load_profile("cpu-host").model_copy(update={"memory_gib": cap / 2**30})
    for options in OPTIONS.values():
        # a training step of this model takes 10-30 s here: start the search at the planner's answer,
        # rounded down to 1K, instead of doubling up from 1K
        start = max(1024, planner.max_seq(model_shape(seq_len=1024, **options), cpu)[0] // 1024 * 1024)
        run_sweep(BenchConfig(**common, start=start, **options), out=out, resume=True, command=command,
                  on_row=lambda r: print(f"  model {label(r)} N={r.seq_len}: {r.status} "
                                         f"{(r.peak_mem_bytes or 0) / 2**20:.0f} MiB {r.time_ms} ms", flush=True))
    rows = [r for r in read_rows(out) if r.target == "model"]
    print(f"\n~125M LongNetLM training step on CPU under a {cap / 2**30:.1f} GiB cap: longest trainable N")
    for name, options in OPTIONS.items():
        mine = [r for r in rows if (r.checkpointing, r.amp) == (options.get("checkpointing", False), options.get("amp"))]
        ok = [r.seq_len for r in mine if r.status == "ok"]
        failed = [r.seq_len for r in mine if r.status == "oom"]
        shape = model_shape(seq_len=1024, **options)
        n_plan, _ = planner.max_seq(shape, cpu)
        print(f"  {name:<26} measured: ok at {max(ok, default=0):,}, oom at {min(failed, default=0):,}; "
              f"plan --max-seq: {n_plan:,}")


def model_shape(**overrides) -> LayerShape:
    fields = dict(impl=IMPL, seq_len=1 << 20, heads=12, embed_dim=768, layers=12, vocab_size=50304, target="model",
                  segment_lengths=SEGMENTS, dilation_rates=DILATIONS, mode="fwdbwd", causal=True)
    return LayerShape(**{**fields, **overrides})


def gpu_part() -> None:
    gpu = load_profile("h100-sxm-80gb")
    segments = dict(segment_lengths=[2048, 4096, 8192, 16384, 32768], dilation_rates=[1, 2, 4, 8, 16])
    print(f"\nplan, ~125M LongNetLM on one {gpu.name} ({gpu.memory_gib:.1f} GiB), LongNet segments {segments['segment_lengths']}")
    for name, options in OPTIONS.items():
        n, _ = planner.max_seq(model_shape(**segments, **options), gpu)
        print(f"  {name:<26} longest trainable N: {n:,}")
    at_1m = planner.plan(model_shape(**segments, checkpointing=True, amp="bf16"), gpu)
    print(f"  at N = 1,048,576 with checkpointing + bf16: {at_1m.memory.total / 2**30:,.1f} GiB "
          f"(peak during {at_1m.memory.phase}):")
    for item, value in sorted(at_1m.memory.items.items(), key=lambda kv: -kv[1])[:5]:
        print(f"    {item:<58} {value / 2**30:8.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="2k,4k,8k,16k")
    parser.add_argument("--cap", default="4GiB", help="memory cap of the model's --until-oom search")
    parser.add_argument("--block-out", type=Path, default=Path("benchmarks/layer_cpu.jsonl"))
    parser.add_argument("--model-out", type=Path, default=Path("benchmarks/model_until_oom_cpu.jsonl"))
    parser.add_argument("--skip-block", action="store_true")
    parser.add_argument("--skip-model", action="store_true")
    args = parser.parse_args()
    command = ["python", "benchmarks/layer_claims.py", "--seq-lens", args.seq_lens, "--cap", args.cap]
    if not args.skip_block:
        block_part(parse_seq_lens(args.seq_lens), args.block_out, command)
    if not args.skip_model:
        model_part(parse_size(args.cap, "--cap"), args.model_out, command)
    gpu_part()


if __name__ == "__main__":
    main()
