"""What a sweep measures: a Problem template (its impl and seq_len are replaced per point) plus the
sweep's lengths and implementations and the measurement settings. One ValueError per mistake."""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..kernels.registry import REGISTRY
from ..runtime.attach import local_ranks
from ..runtime.contention import measurement_threads
from ..runtime.limits import check_spawned_ranks
from ..workload.parse import MAX_CALLS, MAX_SECONDS, MAX_SEED, MAX_SEQ_LEN, MAX_THREADS, check_count, check_number
from ..workload.problem import Problem
from ..workload.records import SETTINGS

DEFAULT_PROCESSES = 3  # bench.processes: an outlier process is one of three
# field: (option, lowest, highest); start, repeat and warmup below their lowest say ">= lowest"
COUNTS = {
    "start": ("--start-seq-len", 1, MAX_SEQ_LEN),
    "repeat": ("--repeat", 1, MAX_CALLS),
    "warmup": ("--warmup", 0, MAX_CALLS),
    "seed": ("--seed", 0, MAX_SEED),
    "threads": ("--threads", 1, MAX_THREADS),
    "processes": ("--processes", 1, MAX_THREADS),
}


class Sweep(Problem):
    impls: list[str]
    seq_lens: list[int] = Field(default_factory=list)
    until_oom: bool = False
    start: int = 4096
    densities: list[float] = Field(default_factory=list)  # block-sparse: one line per target density
    warmup: int | None = None  # None: until the timings settle (bench.sampling)
    repeat: int | None = None  # None: until the median is known to --precision
    precision: float = 3.0  # percent: the 95% CI of the median within +- this (adaptive repeats)
    cache: Literal["warm", "cold"] = "warm"
    interleave: bool = False  # the lines of each N timed round-robin in one worker
    max_memory: int
    max_seconds: float = 120.0
    seed: int = 0
    dist_timeout: float = 120.0
    attached: bool = False  # ranks started by a launcher (runtime.attach), not spawned here
    processes: int | None = None  # worker processes per point (bench.processes); None: 3, or 1 where fixed
    threads: int | None = None  # torch threads per point (per rank); None: runtime.contention.measurement_threads

    @model_validator(mode="before")
    @classmethod
    def _template_impl(cls, data):
        """The template validates as the sweep's first implementation (its impl is replaced per line)."""
        if isinstance(data, dict) and data.get("impls") and "impl" not in data:
            data = {**data, "impl": data["impls"][0]}
        return data

    @field_validator(*COUNTS)
    @classmethod
    def _count(cls, value: int | None, info) -> int | None:
        if value is None:
            return None
        option, low, high = COUNTS[info.field_name]
        if value < low and info.field_name in ("start", "repeat", "warmup"):
            raise ValueError(f"--{info.field_name} must be >= {low}, got {value}")
        return check_count(option, value, low, high)

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: float) -> float:
        return check_number("--precision", value, 0, 100, low_open=True)

    @field_validator("max_seconds", "dist_timeout")
    @classmethod
    def _seconds(cls, value: float, info) -> float:
        """A finite, positive time: it becomes a deadline (inf or NaN would wait forever)."""
        return check_number("--" + info.field_name.replace("_", "-"), value, 0, MAX_SECONDS, low_open=True)

    @model_validator(mode="after")
    def _sweep_consistent(self) -> Sweep:
        if not self.impls:
            raise ValueError("--impl: give at least one implementation or baseline")
        if self.until_oom == bool(self.seq_lens):
            raise ValueError("give exactly one of --seq-len and --until-oom")
        if self.documents is not None and self.seq_lens != [self.seq_len]:
            raise ValueError(
                f"--documents pack {self.seq_len:,} tokens: measure that one length (leave --seq-len out, "
                "no --until-oom)"
            )
        if self.world_size > 1 and not self.attached:
            check_spawned_ranks(self.world_size, device=self.device)
        single = self.until_oom or self.interleave or self.world_size > 1 or self.attached  # one process a point
        if self.processes is None:
            self.processes = 1 if single or self.repeat is not None else DEFAULT_PROCESSES
        elif self.processes > 1 and single:
            raise ValueError(
                f"--processes {self.processes}: only single-process points of a --seq-len sweep take "
                "several processes (not --until-oom, --interleave or distributed points): drop it"
            )
        if self.threads is None:  # attached: the ranks on this node share its CPUs
            self.threads = measurement_threads(None, local_ranks() if self.attached else self.world_size)
        if self.interleave and (self.until_oom or self.world_size > 1):
            why = "--until-oom (its lengths differ per implementation)" if self.until_oom else "--world-size > 1"
            raise ValueError(
                f"--interleave times the lines of each --seq-len round-robin in one process: not with {why}"
                + ("" if self.until_oom else "; compare the runs with dattn compare instead")
            )
        for impl in self.impls:
            for point in self.variants(impl):
                point.with_(seq_len=self.seq_lens[0] if self.seq_lens else self.start)  # each refused here, by name
            if reason := cannot_run(impl, self.device):
                raise ValueError(reason)
        return self

    def variants(self, impl: str) -> list[Problem]:
        """The problem of each measured line of `impl`: one per target density for block-sparse entries."""
        fields = {name: getattr(self, name) for name in Problem.model_fields}
        base = Problem.model_validate({**fields, "impl": impl, "density": None})
        if base.spec.block_sparse and self.densities:
            return [base.with_(density=d) for d in self.densities]
        return [base]

    def point(self, impl: str, seq_len: int) -> Problem:
        """The problem of `impl` at `seq_len` (the first line of a block-sparse density sweep)."""
        return self.variants(impl)[0].with_(seq_len=seq_len)

    def settings(self) -> dict:
        """The settings each row records beside its problem (records.SETTINGS); a resumed point must have been
        measured with them. The precision only where it decided the repeats."""
        return {name: getattr(self, name) for name in SETTINGS} | {
            "precision": self.precision if self.repeat is None else None
        }

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def cannot_run(impl: str, device: str) -> str | None:
    """Why `impl` cannot run on `device` on this machine, with the fix (the install hint when a module it
    needs is missing, whatever else is also in the way); None when it can. A sweep refuses such an
    implementation before measuring anything, instead of filling its table with error rows."""
    spec = REGISTRY[impl]
    reason = spec.unavailable(device)
    if reason is None:
        return None
    missing = [m for m in spec.requires if importlib.util.find_spec(m) is None]
    if missing and spec.install_hint and spec.install_hint not in reason:
        reason += f"; it also needs {', '.join(missing)}: {spec.install_hint}"
    return f"--impl {impl} cannot run with --device {device}: {reason}"
