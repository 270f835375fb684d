"""Hardware profiles: what a device can do, each figure with its source (profiles/*.yaml at the repository
root, dattn_cli/profiles/*.yaml in the wheel).

Units are part of the field names (GiB, GB/s, TFLOP/s, microseconds) so a file cannot be read in the
wrong unit. Files are read by workload/yaml_input.py: a safe loader (nothing is evaluated as code) that
refuses anchors and aliases and bounds the file's size.

Every figure is a plain finite number within physical bounds (BOUNDS: a figure outside them is a typo or
a unit slip, refused naming the field and the range); `true`, "80" or .inf are refused, not coerced:
memory_gib (0, 4096], memory_bandwidth_gb_s and link bandwidth_gb_s (0, 100000] GB/s, peak_tflops
(0, 100000] TFLOP/s or null, latency_us [0, 1000000], efficiency fractions (0, 1], overheads [0, 4096] GiB
and below memory_gib together, devices_per_node [1, 4096], allocator_rounding_bytes [1, 2**30].
"""

from __future__ import annotations

import math
from functools import partial
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..workload.parse import clip
from ..workload.yaml_input import load_yaml, read_yaml

DTYPES = ("float64", "float32", "tf32", "bfloat16", "float16", "float8")
MAX_NAME = 200


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line naming the file and the field."""


def _figure(value: object, low: float, high: float, low_open: bool, integer: bool) -> float | int:
    """`value` if it is a plain finite number (an integer where `integer`) in the range; else ValueError saying so."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    kind = "a whole number" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ValueError(
            f"must be {kind} in {interval}, got {clip(repr(value))} (plain numbers; the unit is in the field name)"
        )
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        raise ValueError(f"must be in {interval}, got {clip(repr(value))}")
    return value


def _bounded(low: float, high: float, *, low_open: bool = True, integer: bool = False):
    check = BeforeValidator(partial(_figure, low=low, high=high, low_open=low_open, integer=integer))
    return Annotated[int if integer else float, check]


GiB = _bounded(0, 4096)  # the largest single-device memory today is under 300 GiB
Overhead = _bounded(0, 4096, low_open=False)
Bandwidth = _bounded(0, 100_000)  # GB/s: HBM3e is about 8,000
Tflops = _bounded(0, 100_000)  # dense peak per device: today's largest is under 10,000
Latency = _bounded(0, 1_000_000, low_open=False)  # microseconds: one second
Fraction = _bounded(0, 1)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PeakTflops(_Strict):
    """Dense (no structured sparsity) peak TFLOP/s per dtype; null where the device has no such rate."""

    float64: Tflops | None = None
    float32: Tflops | None = None
    tf32: Tflops | None = None
    bfloat16: Tflops | None = None
    float16: Tflops | None = None
    float8: Tflops | None = None


class Link(_Strict):
    bandwidth_gb_s: Bandwidth = Field(description="per direction, GB/s (10^9 bytes)")
    latency_us: Latency


class Host(_Strict):
    """A device's host side, for plan --offload (plan/offload.py): its link to the host and the node's memory."""

    link: Link = Field(description="device <-> host, per direction, per device (PCIe, NVLink-C2C)")
    memory_gib_per_node: _bounded(0, 2**20)
    memory_bandwidth_gb_s: Bandwidth = Field(description="the node's host DRAM bandwidth, all sockets")


class AttentionCurve(_Strict):
    """One dense kernel's efficiency curve, e_inf x N / (N + n_half), fitted to published figures
    (plan/efficiency.py)."""

    kernel: StrictStr = Field(min_length=1, max_length=MAX_NAME)
    direction: Literal["fwd", "bwd", "fwdbwd"]
    causal: StrictBool
    head_dim: _bounded(1, 2**16, low_open=False, integer=True)
    dtypes: list[Literal[DTYPES]] = Field(default=["float16", "bfloat16"], min_length=1)
    e_inf: Fraction
    n_half: _bounded(0, 2**40, low_open=False)
    source: StrictStr = Field(min_length=1, description="paper/README, figure or table the fit used")


class Efficiency(_Strict):
    """Fractions of the peaks that real kernels reach (priors; `plan --calibrate` fits them)."""

    attention_compute: Fraction
    memory_bandwidth: Fraction
    communication: Fraction
    per_impl: dict[StrictStr, Fraction] = Field(
        default_factory=dict, description="attention_compute fitted per implementation, or per 'implementation/mode'"
    )
    attention_curves: list[AttentionCurve] = Field(
        default_factory=list,
        description="dense kernels' efficiency vs N (plan/efficiency.py); attention_compute "
        "is the fallback for kernels without one",
    )
    compute_units: _bounded(1, 2**20, low_open=False, integer=True) | None = Field(
        None, description="SMs (CUs) the attention kernels spread thread blocks over: wave quantization"
    )
    kernel_scale: dict[StrictStr, _bounded(0, 10)] = Field(
        default_factory=dict, description="plan --calibrate's factor on a kernel's curve, per 'kernel/mode' or 'kernel'"
    )

    def compute_for(self, impl: str, mode: str | None = None) -> float:
        if mode is not None and f"{impl}/{mode}" in self.per_impl:
            return self.per_impl[f"{impl}/{mode}"]
        return self.per_impl.get(impl, self.attention_compute)


class HardwareProfile(_Strict):
    name: StrictStr = Field(min_length=1, max_length=MAX_NAME)
    kind: Literal["gpu", "cpu"]
    vendor: StrictStr = Field(max_length=MAX_NAME)
    memory_gib: GiB
    memory_bandwidth_gb_s: Bandwidth
    peak_tflops: PeakTflops
    intra_node: Link
    inter_node: Link
    devices_per_node: _bounded(1, 4096, low_open=False, integer=True)
    efficiency: Efficiency
    framework_overhead_gib: Overhead = Field(
        description="CUDA context and allocator reserve, or a CPU process's runtime"
    )
    backward_overhead_gib: Overhead = Field(
        0.0, description="the first backward's fixed cost (autograd engine threads)"
    )
    allocator_rounding_bytes: _bounded(1, 2**30, low_open=False, integer=True)
    host: Host | None = None  # none: plan --offload is refused on this profile
    sources: dict[StrictStr, StrictStr]
    notes: StrictStr | None = None
    calibrated_from: StrictStr | None = None

    @model_validator(mode="after")
    def _room_left(self) -> HardwareProfile:
        if (overhead := self.framework_overhead_gib + self.backward_overhead_gib) >= self.memory_gib:
            raise ValueError(
                f"framework_overhead_gib + backward_overhead_gib = {overhead:g} GiB leaves nothing of "
                f"memory_gib {self.memory_gib:g}: the overheads must be smaller than the memory"
            )
        return self

    @field_validator("sources")
    @classmethod
    def _sources_named(cls, value: dict[str, str]) -> dict[str, str]:
        if missing := {"peak_tflops", "memory", "interconnect"} - set(value):
            raise ValueError(f"sources must name where each figure comes from; missing: {', '.join(sorted(missing))}")
        return value

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def peak_flops(self, dtype: str) -> float | None:
        """FLOP/s for inputs of `dtype` (fp32 on a GPU with TF32 counts as fp32: torch does not enable TF32)."""
        value = getattr(self.peak_tflops, dtype, None)
        return None if value is None else value * 1e12

    def required_peak(self, dtype: str, fix: str = "pick another --dtype") -> float:
        """peak_flops(dtype), or a ValueError saying the profile has none, and `fix`."""
        if (peak := self.peak_flops(dtype)) is None:
            raise ValueError(f"profile {self.name!r} has no {dtype} rate (null in its peak_tflops): {fix}")
        return peak

    def link(self, devices: int) -> tuple[str, Link]:
        """(name, link) a group of `devices` talks over: intra-node while it fits in one node, else inter-node."""
        if devices <= self.devices_per_node:
            return "intra-node", self.intra_node
        return "inter-node", self.inter_node

    def transfer_seconds(self, devices: int, messages: float, nbytes: float) -> float:
        """Seconds to send `messages` messages of `nbytes` bytes in all over the link of `devices` devices."""
        link = self.link(devices)[1]
        return messages * link.latency_us * 1e-6 + nbytes / (link.bandwidth_gb_s * 1e9 * self.efficiency.communication)

    def ridge(self, dtype: str) -> float | None:
        """FLOP per byte at which `dtype`'s peak meets the effective memory bandwidth (None without a rate)."""
        peak = self.peak_flops(dtype)
        return None if peak is None else peak * self.memory_seconds(1.0)

    def memory_seconds(self, nbytes: float) -> float:
        """Seconds to move `nbytes` at the memory bandwidth times its efficiency (a memory-bound pass)."""
        return nbytes / (self.memory_bandwidth_gb_s * 1e9 * self.efficiency.memory_bandwidth)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = clip(".".join(str(p) for p in err["loc"]), 80) or "(top level)"
    got = err.get("input")
    shown = f", got {clip(repr(got))}" if got is not None and not isinstance(got, dict) else ""
    kind, message = err["type"], str(err["msg"]).removeprefix("Value error, ")
    if kind == "missing":
        return f"field {where} is missing: a profile states every figure ('dattn profiles show cpu-host' shows one)"
    if kind == "extra_forbidden":
        return f"field {where} is not a profile field (units belong in the field name, e.g. memory_gib)"
    if kind == "value_error":  # our own checks, which say what they got
        return f"field {where}: {message}" if where != "(top level)" else message
    if kind.startswith("float") or kind.startswith("int"):
        return f"field {where}: {message.lower()}{shown} (plain numbers; the unit is in the field name)"
    return f"field {where}: {message}{shown}"


def parse_profile(text: str, source: str) -> HardwareProfile:
    try:
        data = load_yaml(text, source)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    return _validated(data, source)


def _validated(data: object, source: str) -> HardwareProfile:
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a mapping of profile fields, got {type(data).__name__}")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{source}: {_first_error(exc)}") from None


def shipped_folder() -> Traversable:
    """Where the shipped profiles are: an installed wheel's package data dattn_cli/profiles/, else, run from a
    checkout (an editable install included), profiles/ at the repository root, which pyproject.toml maps to
    that package data."""
    packaged = resources.files("dattn_cli") / "profiles"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "profiles"


def shipped_profiles() -> dict[str, Traversable]:
    """Shipped profile files by name (the file stem, e.g. h100-sxm-80gb), read through importlib.resources so a
    wheel install finds them as a checkout does."""
    found = [f for f in shipped_folder().iterdir() if f.name.endswith(".yaml")]
    return {f.name.removesuffix(".yaml"): f for f in sorted(found, key=lambda f: f.name)}


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by name, or the user's own YAML by path."""
    shipped = shipped_profiles()
    key = str(name_or_path)
    if key in shipped or key.lower() in shipped:
        return parse_profile((shipped.get(key) or shipped[key.lower()]).read_text(), key)
    path = Path(name_or_path)
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL
        found = False
    if not found:
        raise ProfileError(
            f"--profile {clip(repr(key))}: no such shipped profile or file; use one of "
            f"{', '.join(shipped)} or a path to a YAML file"
        )
    try:
        data = read_yaml(path, clip(str(path)))
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    return _validated(data, clip(str(path)))


def dump_profile(profile: HardwareProfile) -> str:
    return yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False, width=120)
