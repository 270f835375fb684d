"""Renderers: pydantic results in, rich tables out. No measurement happens here."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .bench import Regression, SweepResult
from .runtime.envinfo import EnvironmentInfo
from .profiling import ProfileReport
from .verify import VerifyReport


def _fmt(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.1e}"


def verify_table(report: VerifyReport, details: bool = False) -> Table:
    """Per implementation: checks, failures, worst errors; per case (failures, or all with details)."""
    if details or not report.passed:
        return _verify_cases(report, details)
    dtypes = ", ".join(sorted({r.dtype for r in report.results}))
    table = Table(title=f"dattn verify ({dtypes}): worst relative error vs the float64 reference")
    for col in ("impl", "pattern", "checks", "out", "lse", "grads", "status"):
        if col == "impl":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="left" if col in ("status", "pattern") else "right", no_wrap=True, min_width=len(col))
    for impl, world, pattern in dict.fromkeys((r.impl, r.world_size, r.pattern) for r in report.results):
        rows = [r for r in report.results if (r.impl, r.world_size, r.pattern) == (impl, world, pattern)]
        worst = {q: max((e.rel for r in rows for k, e in r.errors.items() if k == q or (q == "grads" and k.startswith("d"))),
                        default=None) for q in ("out", "lse", "grads")}
        bad = sum(not r.passed for r in rows)
        table.add_row(impl if world == 1 else f"{impl} (p={world})", pattern or "-", str(len(rows)), *(_fmt(worst[q]) if worst[q] is not None else "-" for q in ("out", "lse", "grads")),
                      "[green]ok[/]" if not bad else f"[red]{bad} failed[/]")
    return table


def _verify_cases(report: VerifyReport, details: bool) -> Table:
    table = Table(title="dattn verify: " + ("all cases" if details else "failed cases") + " (relative error)")
    for col in ("impl", "pattern", "case", "sem", "causal", "backend", "dtype", "out", "lse", "grads", "status"):
        table.add_column(col, justify="right" if col in ("out", "lse", "grads") else "left", overflow="fold")
    for r in report.results if details else report.failures:
        grads = [e for k, e in r.errors.items() if k.startswith("d")]
        status = "[green]ok[/]" if r.passed else f"[red]FAIL[/] {r.message}".strip()
        table.add_row(
            r.impl if r.world_size == 1 else f"{r.impl} (p={r.world_size})", r.pattern or "-", r.case, r.semantics, "yes" if r.causal else "no", r.backend, r.dtype,
            _fmt(r.errors["out"].rel) if "out" in r.errors else "-",
            _fmt(r.errors["lse"].rel) if "lse" in r.errors else "-",
            _fmt(max(e.rel for e in grads)) if grads else "-",
            status,
        )
    return table


def verify_warnings(report: VerifyReport, details: bool = False) -> list[str]:
    seen = {}
    for r in report.results:
        if r.uncovered_fraction > 0:
            seen[(r.case, r.semantics)] = r.uncovered_fraction
    lines = [f"warning: case '{c}' ({s}): {f:.0%} of (position, head) rows are kept by no pair and output 0"
             for (c, s), f in seen.items()]
    if details:
        lines += [f"skipped: {reason}" for reason in report.skipped]
    elif report.skipped:
        lines.append(f"note: {len(report.skipped)} (implementation, world size, case) combinations cannot be sharded "
                     "and were skipped (--details lists them with the reason)")
    return lines


def verify_summary(report: VerifyReport) -> str:
    n, bad = len(report.results), len(report.failures)
    if not bad:
        return f"[green]verify passed[/]: {n} checks, seed {report.seed}"
    names = sorted({f"{r.impl} ({r.case}, {r.semantics}, causal={r.causal})" for r in report.failures})
    return f"[red]verify FAILED[/]: {bad} of {n} checks; " + "; ".join(names[:8]) + (" ..." if len(names) > 8 else "")


def env_table(info: EnvironmentInfo) -> Table:
    table = Table(title="dattn env", show_header=False)
    table.add_column("key")
    table.add_column("value")
    rows = [
        ("dattn", f"{info.dattn_version}" + (f" (git {info.git_commit[:12]})" if info.git_commit else "")),
        ("python", info.python),
        ("platform", info.platform),
        ("cpu", f"{info.cpu} ({info.cpu_count} logical cores)"),
        ("torch", info.torch_version),
        ("cuda (torch build)", info.cuda_version or "none (CPU build)"),
        ("cuda available", str(info.cuda_available)),
        ("nvidia driver", info.nvidia_driver or "-"),
        ("nvml", info.nvml_status),
    ]
    for d in info.nvidia_devices:
        rows.append((f"gpu {d.index}", f"{d.name}, {d.memory_total_bytes / 2**30:.1f} GiB ({d.memory_used_bytes / 2**30:.1f} used)"))
    rows.append(("backends", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in info.backends.items())))
    for k, v in rows:
        table.add_row(k, v)
    return table


def stderr_console() -> Console:
    return Console(stderr=True)


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def bench_table(result: SweepResult) -> Table:
    rows = result.rows
    title = "dattn bench"
    distributed = any(r.world_size > 1 for r in rows)
    if rows:
        r = rows[0]
        title += (f" ({r.mode}, {r.dtype}, {r.device}, B={r.batch} H={r.heads} D={r.head_dim}"
                  + (f", {r.world_size} ranks: time of the slowest rank, memory and bytes of the largest rank" if distributed else "")
                  + "; time = median of repeats; TFLOP/s counts attended pairs only)")
    table = Table(title=title)
    patterned = any(r.pattern for r in rows)
    columns = (["impl"] + (["pattern", "density"] if patterned else []) + ["N", "time ms", "tokens/s", "TFLOP/s", "peak mem"]
               + (["sent/call", "recv/call"] if distributed else []) + ["status"])
    for col in columns:
        if col == "impl":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="left" if col == "status" else "right", no_wrap=col != "status")
    for r in rows:
        status = "[green]ok[/]" if r.status == "ok" else f"[yellow]{r.status}[/] {r.reason or ''} {r.error or ''}".strip()
        pattern_cells = [r.pattern or "-", f"{r.element_density:.3f}" if r.element_density is not None else "-"]
        cells = [
            r.impl, *(pattern_cells if patterned else []), str(r.seq_len),
            f"{r.time_ms:.1f}" if r.time_ms is not None else "-",
            f"{r.tokens_per_s:,.0f}" if r.tokens_per_s is not None else "-",
            f"{r.tflops:.3f}" if r.tflops is not None else "-",
            _size(r.peak_mem_bytes),
        ]
        if distributed:
            cells += [_size(r.comm_bytes_sent), _size(r.comm_bytes_received)]
        table.add_row(*cells, status)
    for s in result.summaries:
        table.add_section()
        blanks = [""] * (len(columns) - 3 - (2 if patterned else 0))
        lead = [s.impl] + ([s.pattern or "-", ""] if patterned else [])
        table.add_row(*lead, f"max {s.max_ok_seq_len}" if s.max_ok_seq_len else "none", *blanks, s.limit or "all ok")
    return table


def regression_table(regressions: list[Regression], matched: int, threshold: float) -> Table:
    table = Table(title=f"regression gate: {len(regressions)} of {matched} matching points slower by > {threshold:g}%")
    for col in ("impl", "N", "mode", "baseline ms", "current ms", "change"):
        table.add_column(col)
    for r in regressions:
        table.add_row(r.impl, str(r.seq_len), r.mode, f"{r.baseline_ms:.1f}", f"{r.current_ms:.1f}", f"[red]+{r.change_pct:.1f}%[/]")
    return table


def profile_table(report: ProfileReport) -> Table:
    c = report.config
    table = Table(title=f"dattn profile {c.impl} ({c.mode}, {c.dtype}, {c.device}, B={c.batch} N={c.seq_len} "
                        f"H={c.heads} D={c.head_dim}, {c.iterations} iterations; speed-up on/off "
                        f"{report.speedup_on_vs_off:.2f}x)")
    table.add_column("metric")
    table.add_column("caches on", justify="right")
    table.add_column("caches off", justify="right")
    on, off = report.caches_on, report.caches_off

    def row(name, get):
        table.add_row(name, get(on), get(off))

    row("time median ms (p10-p90)", lambda s: f"{s.time.median_ms:.1f} ({s.time.p10_ms:.1f}-{s.time.p90_ms:.1f})")
    row("peak memory above baseline", lambda s: _size(s.memory.peak_above_baseline_bytes))
    row("pattern cache hits / misses", lambda s: f"{s.pattern_cache.hits} / {s.pattern_cache.misses}")
    row("pattern cache hit rate", lambda s: f"{s.pattern_cache.hit_rate:.1%}")
    row("pattern cache evictions, entries, bytes",
        lambda s: f"{s.pattern_cache.evictions}, {s.pattern_cache.entries}, {_size(s.pattern_cache.bytes)}")
    row("pool requests / reuses", lambda s: f"{s.memory_pool.requests} / {s.memory_pool.reuses}")
    row("pool reuse rate", lambda s: f"{s.memory_pool.reuse_rate:.1%}")
    row("pool bytes held (peak)", lambda s: f"{_size(s.memory_pool.bytes_held)} ({_size(s.memory_pool.peak_bytes_held)})")
    if on.memory.cuda_allocator is not None:
        row("cuda allocated peak", lambda s: _size(s.memory.cuda_allocator.allocated_bytes_all_peak))
        row("cuda reserved peak", lambda s: _size(s.memory.cuda_allocator.reserved_bytes_all_peak))
        row("cuda alloc retries / OOMs",
            lambda s: f"{s.memory.cuda_allocator.num_alloc_retries} / {s.memory.cuda_allocator.num_ooms}")
    row("backend", lambda s: s.backend or "-")
    if on.block_pattern is not None:
        row("block pattern", lambda s: s.block_pattern.description if s.block_pattern else "-")
        row("density: blocks / (query, key) pairs",
            lambda s: f"{s.block_pattern.block_density:.4f} / {s.block_pattern.element_density:.4f}" if s.block_pattern else "-")
        row("executor", lambda s: s.block_pattern.executor or "-" if s.block_pattern else "-")
        row("block table / cached pattern bytes",
            lambda s: f"{_size(s.block_pattern.block_table_bytes)} / {_size(s.block_pattern.cached_bytes)}" if s.block_pattern else "-")
    table.caption = f"memory: {on.memory.memory_method}" + (f"; trace: {report.trace_path}" if report.trace_path else "")
    return table


def profiles_table(profiles: dict) -> Table:
    table = Table(title="dattn profiles (dense peak TFLOP/s; memory in GiB; per-direction link GB/s)")
    for col in ("name", "device", "memory", "fp32", "bf16", "intra-node", "per node"):
        table.add_column(col, overflow="fold")
    for name, p in profiles.items():
        t = p.peak_tflops
        table.add_row(name, p.name, f"{p.memory_gib:g}", _num(t.float32), _num(t.bfloat16),
                      f"{p.intra_node.bandwidth_gb_s:g}", str(p.devices_per_node))
    return table


def _num(value) -> str:
    return "-" if value is None else f"{value:g}"


def plan_table(result, solved: str | None, advice: str) -> Table:
    s = result.shape
    what = f"{s.impl} ({s.strategy})"
    target = getattr(s, "target", "attention")
    if target != "attention":
        options = ", ".join(o for o in ("checkpointing" if s.checkpointing else "", f"autocast {s.amp}" if s.amp else "") if o)
        depth = f"LongNetLM {s.layers} x " if target == "model" else ""
        what = (f"{depth}DilatedTransformerBlock E={s.embed_dim} around {s.impl}" + (f" ({options})" if options else "")
                + (f", vocabulary {s.vocab_size:,}" if target == "model" else ""))
    title = (f"dattn plan: {what} on {result.devices} x {result.profile}, N={s.seq_len:,}, B={s.batch} "
             f"H={s.heads} D={s.head_dim}, {s.dtype}, {s.mode}" + (", causal" if s.causal else ""))
    table = Table(title=title, show_header=True)
    table.add_column("item")
    table.add_column("per device", justify="right")
    for name, value in result.memory.items.items():
        table.add_row(name, _size(value))
    table.add_section()
    peak = f"[bold]{_size(result.memory.total)}[/] of {_size(result.capacity_bytes)}"
    phase = getattr(result.memory, "phase", None)
    table.add_row("[bold]peak memory[/]" + (f" (during: {phase})" if phase else ""), peak)
    t = result.time
    if t is not None:
        table.add_section()
        table.add_row("FLOPs (SPEC convention)", f"{t.flops:.3e}")
        table.add_row("compute time", f"{t.compute_s * 1e3:,.1f} ms" + (f" ({t.note})" if target != "attention" else ""))
        if target == "attention":
            table.add_row(f"communication ({t.link}, {t.messages} messages)", f"{_size(t.comm_bytes)}, {t.comm_s * 1e3:,.2f} ms")
            table.add_row("communication hidden under compute", ("yes" if t.comm_hidden else "no") + f" ({t.note})")
        label = {"attention": "time per call", "layer": "time per block call", "model": "time per training step"}[target]
        if target == "model" and s.mode == "fwd":
            label = "time per forward"
        table.add_row(f"[bold]{label}[/]", f"[bold]{t.total_s * 1e3:,.1f} ms[/]")
    table.add_section()
    verdict = "[green]feasible[/]" if result.feasible else "[red]infeasible[/]"
    table.add_row("verdict", f"{verdict}: {result.reason}")
    if solved:
        table.add_row("solver", solved)
    if target == "attention":
        table.add_row("ring chunk advice", advice)
    return table


def check_table(frame, profile: str, stats: dict) -> Table:
    def pct(v):
        return "-" if v is None or v != v else f"{v:+.1f}%"

    med, worst = stats["mem_error_pct_median_abs"], stats["mem_error_pct_max_abs"]
    tmed, tworst = stats["time_error_pct_median_abs"], stats["time_error_pct_max_abs"]
    title = (f"dattn plan --check against {profile}: memory error median {med:.1f}% max {worst:.1f}%; "
             f"time error median {tmed:.1f}% max {tworst:.1f}%" if med is not None and tmed is not None
             else f"dattn plan --check against {profile}")
    table = Table(title=title)
    layered = "target" in frame and any(t != "attention" for t in frame["target"])
    columns = ("impl",) + ("target",) * layered + ("N", "mode", "p", "measured mem", "predicted mem", "mem err",
                                                    "measured ms", "predicted ms", "time err")
    for col in columns:
        table.add_column(col, justify="left" if col in ("impl", "target", "mode") else "right", overflow="fold")
    for r in frame.to_dict(orient="records"):
        table.add_row(r["impl"], *([r["target"]] if layered else []), str(r["seq_len"]), r["mode"], str(r["world_size"]),
                      _size(r["measured_mem_bytes"]),
                      _size(r["predicted_mem_bytes"]), pct(r["mem_error_pct"]),
                      f"{r['measured_ms']:,.1f}" if r["measured_ms"] else "-",
                      f"{r['predicted_ms']:,.1f}" if r["predicted_ms"] else "-", pct(r["time_error_pct"]))
    return table
