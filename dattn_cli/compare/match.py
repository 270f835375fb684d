"""Which points of two reports are the same measurement, and whether the two runs can be compared at all.

Points match by their configuration: workload.records.KEY_FIELDS (implementation, N, mode, shape, pattern,
dtype, device, target, ...); measurement settings (--repeat, --warmup) do not take part. Two
implementations of one run match on the same key without the implementation; a block-sparse pattern
on only one side matches any.

The runs are comparable when their environment records agree on what decides speed; each difference is a
warning naming it, and makes the comparison inconclusive:

* host: `host`/`hostname`/`node` where recorded, the CPU model and count;
* software: torch and CUDA versions;
* device: the GPU models (the device itself is in the key);
* threads: torch threads per point (rows' `threads`, else the environment's), and multi-threaded points
  that took every CPU of either run (such runs shift as a whole, measured: see _every_cpu_warning);
* CPU affinity and frequency governor where recorded (`affinity`/`cpu_affinity`, `governor`);
* load: every load-average figure the records hold (any key containing "load", numbers, lists (the
  first, 1-minute figure) or dicts of them, e.g. at start and end); a clear difference is one of at least
  max(1, CPUs / 4) runnable processes between the two runs' highest figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ..workload.records import KEY_FIELDS, BenchRow, parse_row, point_key
from ..workload.reportfile import read_records
from .stats import checked

HOST_KEYS = ("host", "hostname", "node")
LOAD_SCALE = 0.25  # a clear load difference: this share of the CPUs, and at least one process
SHOWN = 3  # points named in a warning about many


class Side(BaseModel):
    """One point of one report: its row, its samples (None in older reports), where it came from, and the
    reason it was flagged noisy when the bench flagged it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    row: BenchRow
    samples: list[float] | None = None
    where: str
    flag: str | None = None


class Loaded(BaseModel):
    path: str
    points: list[Side]
    environments: list[dict]


def _noisy(row: BenchRow) -> str | None:
    """The bench's reason to distrust the row that the samples cannot show: other processes' CPU (contended)
    or GPU throttling, which shift every call alike. Spread alone is not one: the CI of the ratio accounts for
    it. A row without samples has only its flag to go by."""
    if row.contended or row.throttled or (row.noisy and not row.samples_ms):
        return row.noisy_reason or "flagged noisy by the bench"
    return None


def side_of(row: BenchRow, where: str) -> Side:
    """`row` with its samples checked (positive, finite milliseconds)."""
    samples = None
    if row.samples_ms:
        try:
            samples = [float(v) for v in checked(row.samples_ms, f"{where}: samples_ms")]
        except ValueError as exc:
            raise ValueError(f"{exc}; remove or repair that line") from None
    return Side(row=row, samples=samples, where=where, flag=_noisy(row))


def load_report(path: Path | str, option: str = "report") -> Loaded:
    """The point rows (with samples) and environment records of a `dattn bench` JSONL report, read once (a
    shell's <(...) works). A missing or empty report, or a line that is not a row, is a ValueError."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{option} {path}: no such file: pass a JSONL report written by dattn bench --out")
    points, environments, threads = [], [], None
    for number, data in read_records(path):
        kind = data.get("record", "point")
        if kind == "environment":
            environments.append(data)
        elif kind == "run_end" and environments:  # the load at the end of the run the last record opened
            environments[-1] = {**environments[-1], "load_average_end": data.get("load_average")}
            threads = _config(data).get("threads", data.get("threads", data.get("torch_threads")))
        elif kind == "point":
            where = f"{path}:{number}"
            row = parse_row(where, data)
            if row.threads is None and isinstance(threads, int):
                row = row.model_copy(update={"threads": threads})
            points.append(side_of(row, where))
    if not points:
        raise ValueError(f"{option} {path} holds no point rows: pass a JSONL report written by dattn bench --out")
    return Loaded(path=str(path), points=points, environments=environments)


def describe(row: BenchRow) -> str:
    """'sdpa N=8,192 fwd' (with the pattern or target where there is one): a point in a message."""
    extra = "".join(f" {v}" for v in (row.pattern, row.target if row.target != "attention" else None) if v)
    return f"{row.impl} N={row.seq_len:,} {row.mode}{extra}"


def _index(points: Iterable[Side], key, name: str, warnings: list[str]) -> dict[tuple, Side]:
    index: dict[tuple, Side] = {}
    repeated = []
    for side in points:
        k = key(side.row)
        if k in index:
            repeated.append(side)
        index[k] = side
    if repeated:
        named = ", ".join(f"{describe(s.row)} ({s.where})" for s in repeated[:SHOWN])
        warnings.append(f"{name} measures {len(repeated)} point(s) more than once; the last is used: {named}")
    return index


def _unmatched(sides: list[Side], name: str, other: str) -> str:
    named = ", ".join(describe(s.row) for s in sides[:SHOWN]) + (", ..." if len(sides) > SHOWN else "")
    return f"{len(sides)} point(s) of {name} have no match in {other}: {named}"


def match_reports(base: list[Side], new: list[Side]) -> tuple[list[tuple[Side, Side]], list[str]]:
    """(BASE, NEW) pairs with the same configuration, and warnings (repeated points, unmatched points)."""
    warnings: list[str] = []
    old = _index(base, BenchRow.key, "BASE", warnings)
    now = _index(new, BenchRow.key, "NEW", warnings)
    pairs = [(old[k], now[k]) for k in now if k in old]
    if not pairs:
        raise ValueError(
            "no point of NEW matches a point of BASE by configuration ("
            + ", ".join(KEY_FIELDS[:8])
            + ", ...): compare two reports of the same sweep"
        )
    for sides, name, other in ((old, "BASE", "NEW"), (now, "NEW", "BASE")):
        if rest := [s for k, s in sides.items() if k not in (now if name == "BASE" else old)]:
            warnings.append(_unmatched(rest, name, other))
    return pairs, warnings


def _config(env: dict) -> dict:
    """A record's `config` (the sweep's settings), {} where it has none."""
    return env.get("config") if isinstance(env.get("config"), dict) else {}


def _key(row: BenchRow) -> tuple:
    """The key without the implementation and the pattern (matched separately: it belongs to an impl)."""
    return tuple(v for f, v in zip(KEY_FIELDS, point_key(row.model_dump())) if f not in ("impl", "pattern"))


def match_impls(points: list[Side], impl_a: str, impl_b: str) -> tuple[list[tuple[Side, Side]], list[str]]:
    """(B, A) pairs of one report: the same configuration measured by implementations B and A (the ratio is
    then A/B, so 'slower' means A is slower than B), and warnings."""
    held = sorted({s.row.impl for s in points})
    for option, impl in (("--a", impl_a), ("--b", impl_b)):
        if impl not in held:
            raise ValueError(f"{option} {impl}: the report has no point of it; it holds {', '.join(held)}")
    if impl_a == impl_b:
        raise ValueError(f"--a and --b both name {impl_a}: name two different implementations")
    warnings: list[str] = []
    a = _index([s for s in points if s.row.impl == impl_a], BenchRow.key, impl_a, warnings)
    b = _index([s for s in points if s.row.impl == impl_b], BenchRow.key, impl_b, warnings)
    pairs = []
    for side_a in a.values():
        for side_b in b.values():
            patterns = (side_a.row.pattern, side_b.row.pattern)
            if _key(side_a.row) == _key(side_b.row) and (None in patterns or patterns[0] == patterns[1]):
                pairs.append((side_b, side_a))
    if not pairs:
        raise ValueError(
            f"no point of {impl_a} has the configuration of a point of {impl_b} (N, mode, shape, "
            f"dtype, ...): measure both in one sweep (--impl {impl_a} --impl {impl_b})"
        )
    return pairs, warnings


def _gpus(env: dict) -> str | None:
    devices = env.get("nvidia_devices")
    if not isinstance(devices, list):
        return None
    if not devices:
        return "none"
    return ", ".join(str(d.get("name")) if isinstance(d, dict) else str(d) for d in devices)


def _host(env: dict) -> str | None:
    return next((str(env[k]) for k in HOST_KEYS if env.get(k)), None)


def _threads(env: dict) -> object:
    candidates = (env.get("torch_threads"), env.get("threads"), _config(env).get("threads"))
    return next((v for v in candidates if v is not None), None)


def _affinity(env: dict) -> str | None:
    value = env.get("cpu_affinity", env.get("affinity"))
    return f"{len(value)} CPUs" if isinstance(value, list) else (None if value is None else str(value))


# What decides comparability: (name in a warning, how to read it from an environment record).
FACTS = (
    ("host", _host),
    ("CPU", lambda e: e.get("cpu")),
    ("CPU count", lambda e: e.get("cpu_count")),
    ("torch", lambda e: e.get("torch_version")),
    ("CUDA", lambda e: e.get("cuda_version")),
    ("GPU", _gpus),
    ("torch threads", _threads),
    ("CPU affinity", _affinity),
    ("frequency governor", lambda e: e.get("governor", e.get("cpu_governor"))),
)


def _loads(value: object, depth: int = 0) -> list[float]:
    """The load-average figures in a record's value: a number, the first of a list, a dict's values."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list) and value and isinstance(value[0], (int, float)) and not isinstance(value[0], bool):
        return [float(value[0])]
    if isinstance(value, dict) and depth < 3:
        return [x for v in value.values() for x in _loads(v, depth + 1)]
    return []


def load_figures(env: dict, depth: int = 0) -> list[float]:
    """Every load-average figure of an environment record (keys containing 'load', at any depth up to 3)."""
    found = []
    for key, value in env.items():
        if "load" in str(key).lower():
            found += _loads(value)
        elif isinstance(value, dict) and depth < 3 and key != "config":
            found += load_figures(value, depth + 1)
    return found


def _values(envs: list[dict], read) -> list[str]:
    return list(dict.fromkeys(str(value) for value in map(read, envs) if value is not None))


def _load_warning(base: list[dict], new: list[dict]) -> str | None:
    high_base = max((x for env in base for x in load_figures(env)), default=None)
    high_new = max((x for env in new for x in load_figures(env)), default=None)
    if high_base is None or high_new is None:
        return None
    cpus = max([e["cpu_count"] for e in base + new if isinstance(e.get("cpu_count"), int)], default=1)
    if abs(high_new - high_base) < max(1.0, LOAD_SCALE * cpus):
        return None
    busier = "NEW" if high_new > high_base else "BASE"
    return (
        f"load average differs: BASE up to {high_base:.2f}, NEW up to {high_new:.2f} on {cpus} CPU(s); "
        f"{busier} ran on a busier machine"
    )


def _every_cpu_warning(label: str, envs: list[dict]) -> str | None:
    """Multi-threaded points on every CPU of the run: measured on a quiet 2-vCPU VM, identical runs of them
    differed by factors 0.57-1.79 per point with tight CIs (a kernel waits for its slowest thread, and how often
    the host holds a vCPU back differs between worker processes), so between two such runs a regression cannot
    be told from the machine. Within one run (--a/--b) it does not matter."""
    for env in envs:
        threads, config = _threads(env), _config(env)
        cpus = len(env["cpu_affinity"]) if isinstance(env.get("cpu_affinity"), list) else env.get("cpu_count")
        ranks = config.get("world_size") if isinstance(config.get("world_size"), int) else 1
        if isinstance(threads, int) and isinstance(cpus, int) and threads > 1 and threads * ranks >= cpus > 1:
            return (
                f"{label} ran {threads} torch threads{f' x {ranks} ranks' if ranks > 1 else ''} on all {cpus} "
                f"CPUs: identical runs of that setup differ by up to 1.8x on small VMs, more than a regression; "
                f"rerun with dattn bench's default --threads (it leaves a CPU free)"
            )
    return None


def environment_warnings(base: list[dict], new: list[dict], pairs: list[tuple[Side, Side]]) -> list[str]:
    """One warning per fact that differs between the two runs' environment records (or within one run's,
    e.g. a report resumed elsewhere) and per thread count that differs between matched rows; empty when
    the runs are comparable. A run without an environment record is named, not counted as different."""
    warnings = []
    for name, read in FACTS:
        b, n = _values(base, read), _values(new, read)
        if len(b) > 1 or len(n) > 1:
            warnings.append(f"{name} changes within a run: BASE {', '.join(b) or '?'}; NEW {', '.join(n) or '?'}")
        elif b and n and b != n:
            warnings.append(f"{name} differs: BASE {b[0]}, NEW {n[0]}")
    if load := _load_warning(base, new):
        warnings.append(load)
    warnings += [w for label, envs in (("BASE", base), ("NEW", new)) if (w := _every_cpu_warning(label, envs))]
    threads = {
        (p[0].row.threads, p[1].row.threads)
        for p in pairs
        if None not in (p[0].row.threads, p[1].row.threads) and p[0].row.threads != p[1].row.threads
    }
    if threads and not any(w.startswith("torch threads") for w in warnings):
        warnings.append("torch threads differ: " + ", ".join(f"BASE {b}, NEW {n}" for b, n in sorted(threads)))
    return warnings


def missing_environment(base: list[dict], new: list[dict]) -> list[str]:
    """Notes for a run that recorded no environment (comparability not checked for it)."""
    return [
        f"{name} has no environment record: its machine, torch and load are not checked"
        for name, envs in (("BASE", base), ("NEW", new))
        if not envs
    ]
