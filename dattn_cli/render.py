"""Renderers: pydantic results in, rich tables out. No measurement happens here."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .envinfo import EnvironmentInfo
from .verify import VerifyReport


def _fmt(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.1e}"


def verify_table(report: VerifyReport) -> Table:
    table = Table(title="dattn verify: implementations vs the float64 dense reference (max relative error)")
    for col in ("impl", "case", "sem", "causal", "backend", "dtype", "out", "lse", "grads", "status"):
        table.add_column(col, justify="right" if col in ("out", "lse", "grads") else "left")
    for r in report.results:
        grads = [e for k, e in r.errors.items() if k.startswith("d")]
        grad_rel = max((e.rel for e in grads), default=float("nan"))
        status = "[green]ok[/]" if r.passed else f"[red]FAIL[/] {r.message}".strip()
        if r.passed and r.uncovered_fraction > 0:
            status += f" [yellow](warning: {r.uncovered_fraction:.0%} of rows kept by no pair)[/]"
        table.add_row(
            r.impl, r.case, r.semantics, "yes" if r.causal else "no", r.backend, r.dtype,
            _fmt(r.errors["out"].rel) if "out" in r.errors else "-",
            _fmt(r.errors["lse"].rel) if "lse" in r.errors else "-",
            _fmt(grad_rel) if grads else "-",
            status,
        )
    return table


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
