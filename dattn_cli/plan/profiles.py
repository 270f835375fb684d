"""Hardware profiles: what a device can do, each figure with its source (dattn_cli/profiles/*.yaml).

Units are part of the field names (GiB, GB/s, TFLOP/s, microseconds) so a file cannot be read in the
wrong unit. Files are read with yaml.safe_load: nothing in a profile is ever evaluated as code.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DTYPES = ("float64", "float32", "tf32", "bfloat16", "float16", "float8")


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line naming the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PeakTflops(_Strict):
    """Dense (no structured sparsity) peak TFLOP/s per dtype; null where the device has no such rate."""

    float64: float | None = Field(None, ge=0)
    float32: float | None = Field(None, ge=0)
    tf32: float | None = Field(None, ge=0)
    bfloat16: float | None = Field(None, ge=0)
    float16: float | None = Field(None, ge=0)
    float8: float | None = Field(None, ge=0)


class Link(_Strict):
    bandwidth_gb_s: float = Field(gt=0, description="per direction, GB/s (10^9 bytes)")
    latency_us: float = Field(ge=0)


class Efficiency(_Strict):
    """Fractions of the peaks that real kernels reach (priors; `plan --calibrate` fits them)."""

    attention_compute: float = Field(gt=0, le=1)
    memory_bandwidth: float = Field(gt=0, le=1)
    communication: float = Field(gt=0, le=1)
    per_impl: dict[str, float] = Field(
        default_factory=dict, description="attention_compute fitted per implementation, or per 'implementation/mode'")

    @field_validator("per_impl")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        for name, v in value.items():
            if not 0 < v <= 1:
                raise ValueError(f"per_impl.{name} must be in (0, 1], got {v}")
        return value

    def compute_for(self, impl: str, mode: str | None = None) -> float:
        if mode is not None and f"{impl}/{mode}" in self.per_impl:
            return self.per_impl[f"{impl}/{mode}"]
        return self.per_impl.get(impl, self.attention_compute)


class HardwareProfile(_Strict):
    name: str
    kind: Literal["gpu", "cpu"]
    vendor: str
    memory_gib: float = Field(gt=0)
    memory_bandwidth_gb_s: float = Field(gt=0)
    peak_tflops: PeakTflops
    intra_node: Link
    inter_node: Link
    devices_per_node: int = Field(ge=1)
    efficiency: Efficiency
    framework_overhead_gib: float = Field(ge=0, description="CUDA context and allocator reserve, or a CPU process's runtime")
    backward_overhead_gib: float = Field(0.0, ge=0, description="the first backward's fixed cost (autograd engine threads)")
    allocator_rounding_bytes: int = Field(ge=1)
    sources: dict[str, str]
    notes: str | None = None
    calibrated_from: str | None = None

    @field_validator("sources")
    @classmethod
    def _sources_named(cls, value: dict[str, str]) -> dict[str, str]:
        needed = {"peak_tflops", "memory", "interconnect"}
        missing = needed - set(value)
        if missing:
            raise ValueError(f"sources must name where each figure comes from; missing: {', '.join(sorted(missing))}")
        return value

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def peak_flops(self, dtype: str) -> float | None:
        """FLOP/s for inputs of `dtype` (fp32 on a GPU with TF32 counts as fp32: torch does not enable TF32)."""
        value = getattr(self.peak_tflops, dtype, None)
        return None if value is None else value * 1e12


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    got = err.get("input")
    shown = f", got {got!r}" if got is not None and not isinstance(got, dict) else ""
    kind = err["type"]
    if kind == "missing":
        return f"field {where} is missing"
    if kind == "extra_forbidden":
        return f"field {where} is not a profile field (units belong in the field name, e.g. memory_gib)"
    if kind.startswith("float") or kind.startswith("int"):
        return f"field {where}: {err['msg'].lower()}{shown} (plain numbers; the unit is in the field name)"
    return f"field {where}: {err['msg']}{shown}"


def parse_profile(text: str, source: str) -> HardwareProfile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"{source}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a mapping of profile fields, got {type(data).__name__}")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{source}: {_first_error(exc)}") from None


def shipped_profiles() -> dict[str, Traversable]:
    """Shipped profile files by name (the file stem, e.g. h100-sxm-80gb): package data of dattn_cli.profiles,
    read through importlib.resources so a wheel install finds them as an editable one does."""
    folder = resources.files("dattn_cli") / "profiles"
    found = [f for f in folder.iterdir() if f.name.endswith(".yaml")]
    return {f.name.removesuffix(".yaml"): f for f in sorted(found, key=lambda f: f.name)}


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by name, or the user's own YAML by path."""
    shipped = shipped_profiles()
    key = str(name_or_path)
    path = shipped.get(key) or shipped.get(key.lower())
    if path is None:
        path = Path(name_or_path)
        if not path.is_file():
            raise ProfileError(f"--profile {key!r}: no such shipped profile or file; use one of "
                               f"{', '.join(shipped)} or a path to a YAML file")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_profile(text, str(path))


def dump_profile(profile: HardwareProfile) -> str:
    return yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False, width=120)
