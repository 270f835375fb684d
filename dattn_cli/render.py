"""Renderers: pydantic results in, rich tables out. No measurement happens here."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .envinfo import EnvironmentInfo
from .verify import VerifyReport


def _fmt(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.1e}"


def verify_table(report: VerifyReport, details: bool = False) -> Table:
    """Per implementation: checks, failures, worst errors; per case (failures, or all with details)."""
    if details or not report.passed:
        return _verify_cases(report, details)
    dtypes = ", ".join(sorted({r.dtype for r in report.results}))
    table = Table(title=f"dattn verify ({dtypes}): worst relative error vs the float64 reference")
    for col in ("impl", "checks", "out", "lse", "grads", "status"):
        if col == "impl":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="left" if col == "status" else "right", no_wrap=True, min_width=len(col))
    for impl in dict.fromkeys(r.impl for r in report.results):
        rows = [r for r in report.results if r.impl == impl]
        worst = {q: max((e.rel for r in rows for k, e in r.errors.items() if k == q or (q == "grads" and k.startswith("d"))),
                        default=None) for q in ("out", "lse", "grads")}
        bad = sum(not r.passed for r in rows)
        table.add_row(impl, str(len(rows)), *(_fmt(worst[q]) if worst[q] is not None else "-" for q in ("out", "lse", "grads")),
                      "[green]ok[/]" if not bad else f"[red]{bad} failed[/]")
    return table


def _verify_cases(report: VerifyReport, details: bool) -> Table:
    table = Table(title="dattn verify: " + ("all cases" if details else "failed cases") + " (relative error)")
    for col in ("impl", "case", "sem", "causal", "backend", "dtype", "out", "lse", "grads", "status"):
        table.add_column(col, justify="right" if col in ("out", "lse", "grads") else "left", overflow="fold")
    for r in report.results if details else report.failures:
        grads = [e for k, e in r.errors.items() if k.startswith("d")]
        status = "[green]ok[/]" if r.passed else f"[red]FAIL[/] {r.message}".strip()
        table.add_row(
            r.impl, r.case, r.semantics, "yes" if r.causal else "no", r.backend, r.dtype,
            _fmt(r.errors["out"].rel) if "out" in r.errors else "-",
            _fmt(r.errors["lse"].rel) if "lse" in r.errors else "-",
            _fmt(max(e.rel for e in grads)) if grads else "-",
            status,
        )
    return table


def verify_warnings(report: VerifyReport) -> list[str]:
    seen = {}
    for r in report.results:
        if r.uncovered_fraction > 0:
            seen[(r.case, r.semantics)] = r.uncovered_fraction
    return [f"warning: case '{c}' ({s}): {f:.0%} of (position, head) rows are kept by no pair and output 0"
            for (c, s), f in seen.items()]


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
