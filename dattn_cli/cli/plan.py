"""`dattn plan`: predicted memory per device and time per call from a hardware profile, the solvers, and
the planner checked or calibrated against bench rows."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from ..workload.parse import clip
from .build import generated, model_values
from .options import check_ranks
from .render.common import emit_files, literal, machine_output, note, stdout
from .render.plan import check_table, layout_table, plan_table

MODEL_SHAPE = ("layers", "embed_dim", "heads", "kv_heads", "head_dim", "vocab_size")  # what --model gives
DEFAULT_IMPL = {
    "attention": "ImprovedDilatedAttention",
    "layer": "ImprovedMultiheadDilatedAttention",
    "model": "ImprovedMultiheadDilatedAttention",
}


def _hardware(profile: str, memory: str | None, per_node: int | None = None):
    from ..plan.profiles import load_profile
    from ..workload import parse_size

    hw = load_profile(profile)
    if memory is not None:
        hw = hw.model_copy(update={"memory_gib": parse_size(memory, "--max-memory") / 2**30})
    if per_node is not None:
        if not 1 <= per_node <= 4096:
            raise ValueError(f"--gpus-per-node must be from 1 to 4,096, got {per_node:,}")
        hw = hw.model_copy(update={"devices_per_node": per_node})
    return hw


def _calibrate(hw, report: Path, save: Path | None) -> None:
    from ..plan import check
    from ..plan.profiles import dump_profile

    calibrated = check.calibrate(check.ok_rows(report), hw, str(report))
    text = dump_profile(calibrated)
    if save is not None:
        save.write_text(text)
        note(f"calibrated profile written to {save}")
    else:
        print(text, end="")
    for impl_name, value in calibrated.efficiency.per_impl.items():
        note(f"{impl_name}: attention efficiency {value:.4f} of peak")
    for kernel, value in calibrated.efficiency.kernel_scale.items():
        note(f"{kernel}: {value:.3f} x the profile's efficiency curve")


def _check_files(o: SimpleNamespace) -> None:
    """Before any work: no output over an input (--save over the --calibrate report), outputs writable."""
    from ..workload.reportfile import check_distinct, check_output_path

    outputs = {"--save": o.save, "--json": o.json_out, "--csv": o.csv_out}
    check_distinct({"--check": o.check, "--calibrate": o.calibrate, **outputs}, inputs=("--check", "--calibrate"))
    for option, path in outputs.items():
        check_output_path(path, option)
    if o.calibrate is not None and (o.json_out or o.csv_out):
        raise ValueError("--json and --csv write a plan or a --check; --calibrate writes its profile with --save")


def _check(hw, report: Path, json_out: str | None, csv_out: str | None) -> None:
    from ..plan import check

    frame = check.check_rows(check.ok_rows(report), hw)
    stats = check.summary(frame)
    stdout.print(check_table(frame, hw.name, stats))
    rows = frame.to_dict(orient="records")
    emit_files(json_out, csv_out, {"profile": hw.name, "rows": rows, "summary": stats}, rows)


def _solve(problem, hw, max_seq: bool, min_devices: bool, training=None):
    """(plan, the solver's sentence or None); `training`: a model's layout over devices (plan/parallel.py)."""
    from ..plan import solve

    if max_seq and min_devices:
        raise ValueError("--max-seq and --min-devices solve for different things: give one")
    devices = problem.world_size
    if min_devices and training is not None:
        return _min_model_devices(solve, problem, hw, training)
    if max_seq:
        found = solve.max_seq_search(problem, hw, devices, training)
        n, result = found.seq_len, found.plan
        devices = training.devices if training is not None else devices
        solved = (
            f"no bound found up to N={n:,}: every N the search tried fits on {devices} x {hw.name} (it stops at 2**40)"
            if found.capped
            else f"largest N that fits on {devices} x {hw.name}: {n:,}"
            if n
            else f"no N fits on {devices} x {hw.name}"
        )
        result = result or solve.plan(problem, hw, devices, training)
        return result.model_copy(update={"max_seq_len": n if n and not found.capped else None}), solved
    if min_devices:
        if problem.target != "attention":
            raise ValueError(
                f"--min-devices applies to --target attention; --target {problem.target} is planned on one device"
            )
        d, result = solve.min_devices(problem, hw)
        most = min(solve.DEVICE_SEARCH_CAP, problem.seq_len)
        solved = (
            f"fewest devices for N={problem.seq_len:,}: {d}"
            if d
            else f"no bound found: N={problem.seq_len:,} fits on no number of devices up to {most:,}"
        )
        return result or solve.plan(problem, hw, devices), solved
    return solve.plan(problem, hw, devices, training), None


def _emit(result, solved: str | None, advice: str, room, json_out, csv_out) -> None:
    stdout.print(plan_table(result, solved, advice, room))
    record = {**result.model_dump(), "solved": solved, "chunk_advice": advice, "headroom": room.model_dump()}
    if layouts := _layouts(result.problem):
        stdout.print(layout_table(layouts))
        record["layouts"] = layouts.model_dump()
    emit_files(json_out, csv_out, record, [record])


def _layouts(problem):
    """Work and bytes per rank of every kind and layout, for an attention call over several ranks."""
    from ..plan.layouts import layout_plan

    if problem.target != "attention" or problem.world_size < 2:
        return None
    return layout_plan(problem)


def _documents_only(problem, json_out, csv_out) -> None:
    """Packed documents over several ranks: the memory and time models are one device's (docs/plan.md), so only
    the work and bytes per rank of each layout."""
    layouts = _layouts(problem)
    stdout.print(layout_table(layouts))
    record = {"problem": problem.model_dump(), "layouts": layouts.model_dump()}
    emit_files(json_out, csv_out, record, [record])


def _min_model_devices(solve, problem, hw, training):
    """--min-devices for --target model: the fewest devices, sp at a time, at --zero's stage."""
    d, result = solve.min_model_devices(problem, hw, training)
    if d:
        return result, f"fewest devices for this model's step with --zero {training.zero}: {d}"
    why = (
        "with --zero 0 (DDP) every device holds all weights, gradients and optimizer states: shard them with "
        "--zero 1, 2 or 3"
        if training.zero == 0
        else f"none up to {solve.DEVICE_SEARCH_CAP:,} devices"
    )
    return solve.plan(problem, hw, training=training), f"no number of devices fits: {why}"


def _recompute(o: SimpleNamespace) -> str:
    """--recompute, with --checkpointing as full (the Problem's checkpointing is the full mode)."""
    if o.recompute is None:
        return "full" if o.checkpointing else "none"
    if o.checkpointing and o.recompute != "full":
        raise ValueError(f"--checkpointing is --recompute full: drop it or --recompute {o.recompute}")
    o.checkpointing = o.recompute == "full"
    return o.recompute


def _training(o: SimpleNamespace):
    """A model's layout, optimizer, loss and recompute (plan/parallel.py); refused for other targets."""
    from ..plan.parallel import Training

    recompute = _recompute(o)
    given = dict(sequence_parallel=o.sequence_parallel, zero=o.zero, optimizer=o.optimizer, loss=o.loss)
    given["tensor_parallel"] = o.tensor_parallel
    if o.target != "model":
        unset = dict(sequence_parallel=1, zero=0, optimizer="adamw", loss="standard", tensor_parallel=1)
        extra = (o.offload, o.sp_kind, o.global_batch_tokens, o.search, o.dp_shard is not None)
        if given != unset or recompute == "selective" or any(extra):
            raise ValueError(
                "--sequence-parallel, --sp-kind, --tensor-parallel, --zero, --optimizer, --loss, --offload, "
                "--dp-shard, --recompute selective, --global-batch-tokens and --search apply to --target model"
            )
        return None
    from ..plan.offload import parse

    tokens = _tokens(o.global_batch_tokens) if o.global_batch_tokens is not None else None
    return Training(
        devices=o.world_size,
        recompute=recompute,
        offload=parse(o.offload),
        global_batch_tokens=tokens,
        dp_shard=o.dp_shard,
        **given,
    )


def _tokens(text: str) -> int:
    """'16M' -> 16 x 1024^2 tokens (k = 1024, M = 1024^2, as --seq-len)."""
    match = re.fullmatch(r"\s*(\d{1,15})([kKmMgG]?)\s*", str(text))
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"--global-batch-tokens: {clip(str(text))} is not a token count; write e.g. 16M or 4194304")
    return int(match.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[match.group(2).lower()]


def _search(o: SimpleNamespace, problem, hw, training) -> None:
    """plan --search: the layouts of a named model over --devices, ranked (plan/search.py)."""
    from ..plan import solve
    from ..plan.search import search
    from .render.search import search_table

    varied = dict(
        sequence_parallel=training.sequence_parallel != 1,
        tensor_parallel=training.tensor_parallel != 1,
        zero=training.zero != 0,
        recompute=o.recompute is not None or o.checkpointing,
        loss=training.loss != "standard",
        offload=bool(training.offload),
        sp_kind=o.sp_kind is not None,
        max_seq=o.max_seq,
        min_devices=o.min_devices,
        dp_shard=o.dp_shard is not None,
    )
    if given := [f"--{k.replace('_', '-')}" for k, on in varied.items() if on]:
        raise ValueError(f"--search varies the layout itself: drop {', '.join(given)}")
    if problem.architecture is None or training.global_batch_tokens is None:
        raise ValueError(
            "--search ranks a named model's layouts at a global batch: give --model and --global-batch-tokens"
        )
    note(f"plan --search: planning the layouts of {problem.architecture.name} over {training.devices} devices")
    result = search(problem, hw, training.devices, training.global_batch_tokens, solve.plan)
    title = (
        f"dattn plan --search: {problem.architecture.name}, N={problem.seq_len:,}, B={problem.batch}, "
        f"{training.devices} x {literal(hw.name)} ({hw.devices_per_node} a node), global batch "
        f"{result.global_batch_tokens:,} tokens"
    )
    stdout.print(search_table(result, title))
    record = result.model_dump()
    emit_files(
        o.json_out,
        o.csv_out,
        record,
        [{**r["layout"], **{k: v for k, v in r.items() if k != "layout"}} for r in record["ranked"]],
    )


def _model_advice(solve, problem, hw, training) -> str:
    from ..plan.layers import attention_call

    sp = training.sequence_parallel
    try:
        return solve.chunk_advice(attention_call(problem, sp), hw, sp)
    except ValueError as exc:
        return str(exc)


def _lengths(values: dict, devices: int, max_seq: bool, min_devices: bool) -> dict:
    """With --documents, N is their sum (over several ranks plan gives their work and bytes per rank only)."""
    if values.get("documents") is None:
        return values
    if max_seq or min_devices:
        raise ValueError("--documents fix N (their sum): drop --max-seq/--min-devices")
    return {**values, "seq_len": sum(values["documents"])}


def _named_model(o: SimpleNamespace) -> dict | None:
    """The Problem fields of --model or --model-config (workload/model_presets.py), or None; sets the target."""
    if o.model is None and o.model_config is None:
        if o.tiled_mlp or o.fp8 or o.fused_norm:
            which = (
                "--tiled-mlp tiles a named model's MLP"
                if o.tiled_mlp
                else f"--fp8 {o.fp8} runs a named model's linears"
                if o.fp8
                else "--fused-norm fuses a named model's norms"
            )
            raise ValueError(f"{which}: give --model or --model-config")
        o.target = o.target or "attention"
        return None
    if o.model is not None and o.model_config is not None:
        raise ValueError("--model and --model-config both name the model: give one")
    from ..workload.model_presets import load_preset, read_config

    which = "--model" if o.model is not None else "--model-config"
    fields = load_preset(o.model) if o.model is not None else read_config(o.model_config)
    if given := [f"--{k.replace('_', '-')}" for k in MODEL_SHAPE if getattr(o, k) is not None]:
        raise ValueError(f"{which} gives the model's shape: drop {', '.join(given)}")
    if o.target == "attention":
        raise ValueError(f"{which} plans a model: drop --target attention (--target layer plans one block)")
    o.target = o.target or "model"
    # the dense baseline (kernels/registry.py); --kernel picks its efficiency curve, --sp-kind its split
    o.impl = o.impl or "sdpa"
    if o.tiled_mlp or o.fp8 or o.fused_norm:
        update = {"tiled_mlp": bool(o.tiled_mlp), "fp8": o.fp8, "fused_norm": bool(o.fused_norm)}
        fields["architecture"] = fields["architecture"].model_copy(update=update)
    return fields


def _problem(o: SimpleNamespace):
    """(the Problem, a model's training layout or None); for a model the Problem is one replica's sequence."""
    from ..workload import Problem

    named = _named_model(o)
    if o.target == "attention":
        check_ranks([o.impl or DEFAULT_IMPL[o.target]], o.world_size, "--world-size")
    training = _training(o)
    if training is not None:
        o.world_size = 1  # training.devices carries the layout
        if o.impl is None and o.sequence_parallel > 1:  # dattn's LongNet block: the multihead class of the kind
            from ..plan.context import MULTIHEAD_IMPLS

            o.impl = MULTIHEAD_IMPLS[o.sp_kind or "ring"]
    o.impl = o.impl or DEFAULT_IMPL[o.target]
    values = _lengths(model_values("plan", vars(o), Problem), o.world_size, o.max_seq, o.min_devices)
    problem = Problem(**{**values, **(named or {})})
    from ..plan.recompute import check

    check(problem, training.recompute if training else ("full" if problem.checkpointing else "none"))
    if training is not None:
        from ..plan.parallel import check_impl

        check_impl(problem, training)
    return problem, training


@generated("plan")
def plan(**given: Any) -> None:
    """Predict memory per device and time per call from a stated model (docs/plan.md), or check it against bench rows.

    Default --impl: ImprovedDilatedAttention, or ImprovedMultiheadDilatedAttention for --target layer|model, or sdpa
    (dense) for --model and --model-config.
    """
    o = SimpleNamespace(**given)
    machine_output(o.json_out, o.csv_out)
    _check_files(o)
    from ..plan import solve

    hw = _hardware(o.profile, o.max_memory, o.gpus_per_node)
    if o.world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {o.world_size}")
    if o.save is not None and o.calibrate is None:
        raise ValueError("--save goes with --calibrate REPORT.jsonl")
    if o.calibrate is not None:
        return _calibrate(hw, o.calibrate, o.save)
    if o.check is not None:
        return _check(hw, o.check, o.json_out, o.csv_out)
    problem, training = _problem(o)
    from ..plan import fp8

    fp8.check(problem, hw)
    if training is not None and training.offload:
        from ..plan.offload import check as check_offload

        check_offload(problem, training, hw.host is not None, hw.name)
    if problem.documents is not None and problem.world_size > 1:
        return _documents_only(problem, o.json_out, o.csv_out)
    if o.search:
        return _search(o, problem, hw, training)
    result, solved = _solve(problem, hw, o.max_seq, o.min_devices, training)
    advice = (
        solve.chunk_advice(result.problem, hw, result.devices)
        if training is None
        else _model_advice(solve, result.problem, hw, training)
    )
    _emit(result, solved, advice, solve.headroom(result, hw, training), o.json_out, o.csv_out)
    if o.fail_if_infeasible and not result.feasible:
        raise typer.Exit(code=1)
