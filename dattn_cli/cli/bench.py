"""`dattn bench`: sweep sequence lengths (or densities), each point in an isolated worker. Its options are made
from the Problem's fields and cli/options.py (cli/build.py); this module adds --quick's and the layer target's
defaults, builds the Sweep, runs it and hands the result to cli/bench_files.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from ..runtime.heartbeat import current
from ..runtime.signals import Interrupted
from ..workload.problem_options import DEFAULT_MODE
from .attach import agreed_exit_code, attached_resume, joined
from .bench_files import check_outputs, command_line, fail, gate, interrupted, points_kept, show
from .build import generated, model_values
from .options import check_ranks
from .render.bench import point_line
from .render.common import machine_output, note, progress, set_quiet

QUICK = {
    "impls": ["DilatedAttention", "ImprovedDilatedAttention", "sdpa"],
    "seq_lens": "2k,4k,8k",
    "segments": "512,1024,2048",
    "dilations": "1,2,4",
}
QUICK_MAX_SECONDS = 10.0  # --quick: adaptive repeats stop within 10 s a point on a noisy machine
# --target layer/model without --impl: the multihead module a user would put in a model
LAYER_DEFAULT_IMPL = "ImprovedMultiheadDilatedAttention"
# rank 0's alone when attached (the gate is rank 0's too: --fail-on-regression goes with --baseline)
OUTPUTS = ("out", "csv_out", "json_out", "markdown", "plot", "baseline", "fail_on_regression")


def default_max_memory(device: str = "cpu") -> int:
    """CPU: half of the memory available right now, so the sweep can never drive the host into its OOM killer.
    CUDA: the whole card (no cap; NVML's total, read without starting CUDA in this process)."""
    if device.startswith("cuda"):
        from ..runtime.gpustate import gpu_memory_bytes

        if total := gpu_memory_bytes(int(device.split(":")[1]) if ":" in device else 0):
            return total
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 4 * 2**30


def _max_memory(o: SimpleNamespace) -> int:
    """--max-memory; else, resuming, the cap the report was measured with (the default moves with the free
    memory, and a resumed point must be measured under the same cap); else half of the available memory."""
    from ..workload import parse_size
    from ..workload.records import recorded_setting

    if o.max_memory:
        return parse_size(o.max_memory)
    recorded = recorded_setting(o.out, "max_memory") if o.resume and o.out is not None else None
    return recorded if isinstance(recorded, int) and recorded > 0 else default_max_memory(o.device or "cpu")


def _defaults(o: SimpleNamespace) -> None:
    """--quick's and the layer target's defaults, set in `o`."""
    o.mode = o.mode or ("fwd" if o.quick else DEFAULT_MODE)
    if not o.impls and o.target != "attention":
        o.impls = [LAYER_DEFAULT_IMPL]
    if o.quick:
        o.impls, o.segment_lengths, o.dilation_rates = o.impls or QUICK["impls"], QUICK["segments"], QUICK["dilations"]
        o.seq_lens = o.seq_lens if o.seq_lens or o.until_oom else QUICK["seq_lens"]
        o.processes = o.processes or 1
    o.processes = o.processes or None
    o.max_seconds = o.max_seconds or (QUICK_MAX_SECONDS if o.quick else None)
    if not o.impls:
        raise ValueError("--impl: give at least one, e.g. --impl ImprovedDilatedAttention --impl sdpa (or use --quick)")


def _sweep(o: SimpleNamespace, world):
    """The Sweep of the options; with --documents its one length is their sum."""
    from ..bench import Sweep

    values = model_values("bench", vars(o), Sweep)
    if documents := values.get("documents"):
        values = {"seq_lens": [sum(documents)], **values, "seq_len": sum(documents)}
    return Sweep(**{**values, "max_memory": _max_memory(o), "attached": world is not None})


def _lines(sweep) -> int:
    """Measured lines: one per implementation, one per target density for block-sparse ones."""
    from ..kernels.registry import REGISTRY

    return sum(len(sweep.densities) if REGISTRY[i].block_sparse and sweep.densities else 1 for i in sweep.impls)


def _run(sweep, o: SimpleNamespace, world):
    from ..bench import run_sweep
    from ..bench.attached import AttachedRunner, resumed_points
    from ..plan.solve import predicted_peak_bytes
    from ..workload.reportfile import ReportWriteError

    if world is not None:
        done = resumed_points(world, o.out, sweep.dist_timeout) if o.attached_resume else {}
        runner = AttachedRunner(world, sweep.dist_timeout, done)
    try:
        with progress() as bar:
            task = bar.add_task("bench", total=None if sweep.until_oom else _lines(sweep) * len(sweep.seq_lens))
            return run_sweep(
                sweep,
                out=o.out,
                resume=o.resume,
                command=command_line(),
                on_row=lambda row: bar.update(task, advance=1, description=point_line(row)),
                predict=predicted_peak_bytes,
                runner=runner if world is not None else None,
            )
    except ReportWriteError as exc:  # the machine failed, not the input: exit 1
        fail(f"{exc}; rerun with --resume once there is room")


def _exit(world, result, code: int, timeout_s: float) -> None:
    """Exit with `code`, agreed over an attached world's ranks; there a point a rank failed is exit 1 on every
    rank, the rank named (the world is not trusted after it: bench.attached); rank 0 alone says so."""
    if world is not None and (failed := next((r for r in result.rows if r.status == "error"), None)):
        if world.rank == 0:
            note(f"dattn: error: {failed.error}", style="red")
        code = max(code, 1)
    if (code := agreed_exit_code(world, code, timeout_s)) != 0:
        raise typer.Exit(code=code)


@generated("bench")
def bench(**given: Any) -> None:
    """Sweep sequence lengths: time, memory, TFLOP/s per implementation, each point in an isolated worker."""
    o = SimpleNamespace(**given)
    world = joined(o, o.world_size, OUTPUTS)
    if world is not None:
        o.world_size = world.world_size
        o.attached_resume = attached_resume(o, world)
        if (watch := current()) is not None:
            watch.kept = lambda: points_kept(watch.report)
    machine_output(o.csv_out, o.json_out, o.markdown)
    set_quiet(o.quiet)
    _defaults(o)
    baseline = check_outputs(o)
    check_ranks(o.impls, o.world_size, "--world-size")
    sweep = _sweep(o, world)
    try:
        result = _run(sweep, o, world)
    except Interrupted as exc:
        raise interrupted(sweep, exc, o) from None
    code = 0
    if world is None or world.rank == 0:
        show(sweep, result, o)
        code = gate(result, baseline, o.fail_on_regression) if baseline is not None else 0
    _exit(world, result, code, o.dist_timeout)
