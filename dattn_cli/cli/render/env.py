"""`dattn env`, `dattn profiles list` and `dattn impls`: what this machine, the shipped hardware profiles and
the registry offer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.markup import escape
from rich.table import Table

from .common import num

if TYPE_CHECKING:
    from ...plan.profiles import HardwareProfile
    from ...runtime.envinfo import EnvironmentInfo


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
    rows += [
        (f"gpu {d.index}", f"{d.name}, {d.memory_total_bytes / 2**30:.1f} GiB ({d.memory_used_bytes / 2**30:.1f} used)")
        for d in info.nvidia_devices
    ]
    rows.append(("backends", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in info.backends.items())))
    rows.extend(block_kernel_rows(info))
    for k, v in rows:  # what the machine reports (CPU and GPU names) is text, not markup
        table.add_row(escape(k), escape(str(v)))
    return table


def block_kernel_rows(info: EnvironmentInfo) -> list[tuple[str, str]]:
    """What the blocks' kernel choice is here: forced by DATTN_BLOCK_KERNEL, or each cached probe's choice per
    backend with the kernels' steady ms and compile seconds."""
    rows = [("block kernel forced", info.block_kernel_forced or "no (DATTN_BLOCK_KERNEL unset: the probe decides)")]
    for c in info.block_kernels or []:
        chosen = ", ".join(f"{family} -> {c.get(family) or '-'}" for family in ("sdpa", "flash", "auto"))
        timings = ", ".join(
            f"{name} {ms:.3g} ms" if ms is not None else f"{name} failed" for name, ms in c["timings_ms"].items()
        )
        compile_s = ", ".join(f"{name} {s:g} s" for name, s in c["compile_s"].items() if s)
        rows.append(
            (
                f"block kernel ({c['gpu']}, {c['dtype']}, D={c['head_dim']})",
                f"{chosen}; fwd+bwd {timings}" + (f"; compile {compile_s}" if compile_s else ""),
            )
        )
    if not info.block_kernels:
        rows.append(("block kernel probes", "none cached for this torch (cpu: sdpa -> cpu-flash)"))
    return rows


def profiles_table(profiles: dict[str, HardwareProfile]) -> Table:
    table = Table(title="dattn profiles (dense peak TFLOP/s; memory in GiB; per-direction link GB/s)")
    for col in ("name", "device", "memory", "fp32", "bf16", "intra-node", "per node"):
        table.add_column(col, overflow="fold")
    for name, p in profiles.items():
        t = p.peak_tflops
        table.add_row(
            escape(name),
            escape(p.name),
            f"{p.memory_gib:g}",
            num(t.float32),
            num(t.bfloat16),
            f"{p.intra_node.bandwidth_gb_s:g}",
            str(p.devices_per_node),
        )
    return table


def impls_table(entries: list[dict], kernels: dict[str, str] | None = None) -> Table:
    """One row per registry entry (cli/impls.py's records); why an entry cannot run here goes below, with the
    kernel each block backend runs on here (`kernels`)."""
    table = Table(
        title="dattn impls: the registry (verify, bench, profile and plan take these as --impl)",
        box=box.SIMPLE_HEAD,
        padding=0,
    )
    for col in ("name", "kind", "strategy", "baseline", "backends", "where", "here"):
        table.add_column(col, no_wrap=col != "where")
    reasons = []
    for e in entries:
        here = ", ".join(e["available_on"]) if e["available"] else "[yellow]no[/]"
        if not e["available"]:
            reasons.append(f"{escape(e['name'])}: {escape(e['unavailable'])}")
        table.add_row(
            escape(e["name"]),
            e["kind"],
            e["strategy"],
            "yes" if e["baseline"] else "-",
            escape(",".join(e["backends"]) or "-"),
            escape(e["where"]),
            here,
        )
    lines = ["not here: " + "; ".join(reasons)] if reasons else []
    if kernels:
        lines.append("block kernels here: " + ", ".join(f"{b} -> {escape(k)}" for b, k in kernels.items()))
    table.caption = "\n".join(lines) or None
    return table
