"""Layer-level claims, measured: what checkpointing, mixed precision and dilation buy in a real layer.

1. block: one DilatedTransformerBlock of the ~125M LongNetLM (E=768, 12 heads, MLP 4x, causal, fp32
   weights), forward+backward at N = 2K..16K, plain / --checkpointing / --amp bf16 / both (--options picks),
   and the same block with dense causal attention (one segment longer than N, r=1) -> time and peak memory
   side by side.
2. model: the ~125M LongNetLM (E=768, 12 heads, 12 layers, vocabulary 50,304) training step (forward,
   loss, backward, AdamW) under a memory cap, `--until-oom` for each option: the longest trainable N on
   this machine, next to `dattn plan --target model --max-seq --max-memory CAP`.
3. the planner on a GPU profile: the longest N of that model per option on an 80 GB H100, and the
   breakdown at N = 1M (what the "125M model on 1M tokens on 80 GB" claim would need).

    python benchmarks/layer_claims.py [--seq-len 2k,4k,8k,16k] [--cap 3GiB] [--skip-block] [--skip-model]
    python benchmarks/layer_claims.py --device cuda [--profile h100-sxm-80gb] [--options ckpt+bf16,plain]
    python benchmarks/layer_claims.py --seq-len 1k --options plain --cap 1GiB      # a quick look
    python benchmarks/layer_claims.py --block-out benchmarks/layer_cpu.jsonl \
        --model-out benchmarks/model_until_oom_cpu.jsonl --resume

Every point is an ordinary `dattn bench` point (one isolated worker each). Each run measures afresh: block
rows go to a new results/layer_<device>-<time>.jsonl and model rows to results/model_until_oom_<device>-
<time>.jsonl, unless --block-out / --model-out name the reports; --resume continues those (both must be
given for the parts that run), measuring only the points they lack.
On CUDA the block runs at 32K and 128K with LongNet segments up to 32K, the model search has no cap
(the GPU's own memory is the limit) and starts at half the planner's answer for --profile.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _reports import Report, add_deprecated_alias, add_resume_option, report_path, script_command

from dattn_cli.bench import Sweep
from dattn_cli.plan import predicted_peak_bytes, solve as planner
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem, parse_seq_lens, parse_size
from dattn_cli.workload.records import read_rows, row_problem

IMPL = "ImprovedMultiheadDilatedAttention"
SEGMENTS, DILATIONS = [2048, 4096, 8192], [1, 2, 4]
GPU_SEGMENTS, GPU_DILATIONS = [2048, 4096, 8192, 16384, 32768], [1, 2, 4, 8, 16]
DENSE = dict(segment_lengths=[1 << 20], dilation_rates=[1])  # one segment longer than any N: dense causal
OPTIONS = {
    "plain": {},
    "checkpointing": {"checkpointing": True},
    "amp bf16": {"amp": "bf16"},
    "checkpointing + amp bf16": {"checkpointing": True, "amp": "bf16"},
}
SHORT = {"plain": "plain", "ckpt": "checkpointing", "bf16": "amp bf16", "ckpt+bf16": "checkpointing + amp bf16"}
MODEL = dict(heads=12, head_dim=64, layers=12, vocab_size=50304)


def label(row) -> str:
    options = [o for o in ("checkpointing" if row.checkpointing else "", f"amp {row.amp}" if row.amp else "") if o]
    attention = "dense" if row.segments == DENSE["segment_lengths"] else "dilated"
    return f"{attention}, {' + '.join(options) or 'plain'}"


def block_part(seq_lens: list[int], report: Report, device: str, profile_name: str, chosen: list[str]) -> None:
    cuda = device.startswith("cuda")
    common = dict(
        impls=[IMPL],
        seq_lens=seq_lens,
        mode="fwdbwd",
        heads=12,
        head_dim=64,
        causal=True,
        target="layer",
        warmup=2 if cuda else 1,
        repeat=10 if cuda else 3,
        max_memory=16 * 2**30,
        max_seconds=900.0,
        device=device,
    )
    segments = (
        dict(segment_lengths=GPU_SEGMENTS, dilation_rates=GPU_DILATIONS)
        if cuda
        else dict(segment_lengths=SEGMENTS, dilation_rates=DILATIONS)
    )
    configs = [Sweep(**segments, **common, **OPTIONS[name]) for name in chosen]
    configs.append(Sweep(**DENSE, **common))
    for cfg in configs:
        report.sweep(
            cfg,
            on_row=lambda r: print(f"  block {label(r)} N={r.seq_len}: {r.status} {r.time_ms} ms", flush=True),
            predict=predicted_peak_bytes,
        )
    rows = [r for r in read_rows(report.path) if r.status == "ok" and r.target == "layer"]
    profile = load_profile(profile_name)
    print(
        f"\nblock E=768 H=12, fwd+bwd, causal, {device}; ratios against the plain dilated block at the same N"
        f" (rows: {report.path})"
    )
    for n in seq_lens:
        at = {label(r): r for r in rows if r.seq_len == n}
        base = at.get("dilated, plain")
        for name, r in at.items():
            predicted = planner.plan(row_problem(r), profile).memory.total
            ratio = (
                f" = {r.time_ms / base.time_ms:.2f}x time, {r.peak_mem_bytes / base.peak_mem_bytes:.2f}x memory"
                if base
                else ""
            )
            print(
                f"  N={n:>6} {name:<36} {r.time_ms:9.1f} ms {r.peak_mem_bytes / 2**20:8.1f} MiB"
                f" (plan {predicted / 2**20:7.1f} MiB){ratio}"
            )


def model_part(cap: int, report: Report, device: str, profile_name: str, chosen: list[str]) -> None:
    cuda = device.startswith("cuda")
    segments = (
        dict(segment_lengths=GPU_SEGMENTS, dilation_rates=GPU_DILATIONS)
        if cuda
        else dict(segment_lengths=SEGMENTS, dilation_rates=DILATIONS)
    )
    common = dict(
        impls=[IMPL],
        until_oom=True,
        mode="fwdbwd",
        target="model",
        **segments,
        device=device,
        warmup=1,
        repeat=3 if cuda else 1,
        max_memory=cap,
        max_seconds=900.0,
        **MODEL,
    )
    profile = load_profile(profile_name)
    if not cuda:
        profile = profile.model_copy(update={"memory_gib": cap / 2**30})
    for name in chosen:
        options = OPTIONS[name]
        # a CPU training step of this model takes 10-30 s: start the search at the planner's answer, rounded
        # down to 1K, instead of doubling up from 1K. On a GPU start at half of it, so that the search has
        # an ok point below the limit even where the plan is optimistic.
        planned = planner.max_seq(model_shape(seq_len=1024, **segments, **options), profile)[0]
        start = max(1024, int(planned * (0.5 if cuda else 1.0)) // 1024 * 1024)
        report.sweep(
            Sweep(**common, start=start, **options),
            on_row=lambda r: print(
                f"  model {label(r)} N={r.seq_len}: {r.status} "
                f"{(r.peak_mem_bytes or 0) / 2**20:.0f} MiB {r.time_ms} ms",
                flush=True,
            ),
            predict=predicted_peak_bytes,
        )
    rows = [r for r in read_rows(report.path) if r.target == "model"]
    where = f"on {profile.name}" if cuda else f"on CPU under a {cap / 2**30:.1f} GiB cap"
    print(f"\n~125M LongNetLM training step {where}: longest trainable N (rows: {report.path})")
    for name in chosen:
        options = OPTIONS[name]
        mine = [
            r for r in rows if (r.checkpointing, r.amp) == (options.get("checkpointing", False), options.get("amp"))
        ]
        ok = [r.seq_len for r in mine if r.status == "ok"]
        failed = [r.seq_len for r in mine if r.status == "oom"]
        shape = model_shape(seq_len=1024, **segments, **options)
        n_plan, _ = planner.max_seq(shape, profile)
        print(
            f"  {name:<26} measured: ok at {max(ok, default=0):,}, oom at {min(failed, default=0):,}; "
            f"plan --max-seq: {n_plan:,}"
        )


def model_shape(**overrides) -> Problem:
    fields = dict(
        impl=IMPL,
        seq_len=1 << 20,
        heads=12,
        embed_dim=768,
        layers=12,
        vocab_size=50304,
        target="model",
        segment_lengths=SEGMENTS,
        dilation_rates=DILATIONS,
        mode="fwdbwd",
        causal=True,
    )
    return Problem(**{**fields, **overrides})


def gpu_part() -> None:
    gpu = load_profile("h100-sxm-80gb")
    segments = dict(segment_lengths=[2048, 4096, 8192, 16384, 32768], dilation_rates=[1, 2, 4, 8, 16])
    print(
        f"\nplan, ~125M LongNetLM on one {gpu.name} ({gpu.memory_gib:.1f} GiB), "
        f"LongNet segments {segments['segment_lengths']}"
    )
    for name, options in OPTIONS.items():
        n, _ = planner.max_seq(model_shape(**segments, **options), gpu)
        print(f"  {name:<26} longest trainable N: {n:,}")
    at_1m = planner.plan(model_shape(**segments, checkpointing=True, amp="bf16"), gpu)
    print(
        f"  at N = 1,048,576 with checkpointing + bf16: {at_1m.memory.total / 2**30:,.1f} GiB "
        f"(peak during {at_1m.memory.phase}):"
    )
    for item, value in sorted(at_1m.memory.items.items(), key=lambda kv: -kv[1])[:5]:
        print(f"    {item:<58} {value / 2**30:8.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--profile", default=None, help="planner profile to compare with (default cpu-host / h100-sxm-80gb)"
    )
    parser.add_argument("--seq-len", default=None, help="block lengths (default 2k,4k,8k,16k on CPU, 32k,128k on CUDA)")
    add_deprecated_alias(parser, "--seq-lens", "--seq-len")
    parser.add_argument("--cap", default="3GiB", help="memory cap of the model's --until-oom search (CPU only)")
    parser.add_argument(
        "--options",
        default="plain,ckpt,bf16,ckpt+bf16",
        help=f"options to measure (block, and one model search each), of {', '.join(SHORT)}",
    )
    parser.add_argument("--block-out", type=Path, default=None, help="block report (default: a new results/ file)")
    parser.add_argument("--model-out", type=Path, default=None, help="model report (default: a new results/ file)")
    add_resume_option(parser)
    parser.add_argument("--skip-block", action="store_true")
    parser.add_argument("--skip-model", action="store_true")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    device_tag = "cuda" if cuda else "cpu"
    profile = args.profile or ("h100-sxm-80gb" if cuda else "cpu-host")
    seq_lens = args.seq_len or ("32k,128k" if cuda else "2k,4k,8k,16k")
    chosen = [SHORT.get(o.strip()) for o in args.options.split(",")]
    if None in chosen:
        parser.error(f"--options: use a comma list of {', '.join(SHORT)}")
    reports = {}
    for part, option, stem in (("block", "--block-out", "layer"), ("model", "--model-out", "model_until_oom")):
        if not getattr(args, f"skip_{part}"):
            path = report_path(parser, getattr(args, f"{part}_out"), args.resume, f"{stem}_{device_tag}", option)
            reports[part] = Report(parser, path, args.resume, script_command())
    if "block" in reports:
        block_part(parse_seq_lens(seq_lens), reports["block"], args.device, profile, chosen)
    if "model" in reports:
        model_part(parse_size(args.cap, "--cap"), reports["model"], args.device, profile, chosen)
    gpu_part()


if __name__ == "__main__":
    main()
