"""The GPU's state around a point (NVML: clocks, temperature, power, the reasons its clocks are held down), and
a cache flusher for cold-cache timing.

A point timed while the GPU was power capped or thermally slowed measures the cooling, not the kernel; NVBench
checks the same throttle reasons. The cold cache follows triton's do_bench, which zeroes a buffer larger than
the L2 before each call so no call finds the previous call's data in cache.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# NVML's clocks event (throttle) reason bits 0x1, 0x2, ... 0x400 (nvml.h nvmlClocksEventReason* /
# nvmlClocksThrottleReason*), in bit order
REASON_NAMES = (
    "idle applications_clocks sw_power_cap hw_slowdown sync_boost sw_thermal hw_thermal hw_power_brake display_clocks "
    "board_limit reliability"
)
REASONS = {1 << bit: name for bit, name in enumerate(REASON_NAMES.split())}
# what holds a busy GPU's clocks below what it would run at (idle, application clocks, display, sync boost: not)
LIMITING = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake", "board_limit", "reliability")
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0  # nvml.h enum values
CPU_CACHE_FALLBACK = 64 * 2**20
CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def decode_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clocks event reason mask; an unknown bit as its hex value."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    return names + [hex(1 << i) for i in range(64) if mask & (1 << i) and (1 << i) not in REASONS]


def nvml_ask(nvml: Any, fn: str, handle: Any, *args: Any) -> Any:
    """nvml.fn(handle, *args), or None where the query fails, is not supported or this pynvml lacks it."""
    try:
        return getattr(nvml, fn)(handle, *args)
    except Exception:  # one unsupported query (or an old driver without it) leaves its field empty
        return None


def nvml_state(nvml: Any, handle: Any) -> dict:
    """gpu_state's fields for an NVML device handle (NVML initialized by the caller); a field None where its
    query fails or is not supported."""

    def ask(fn: str, *args: Any) -> Any:
        return nvml_ask(nvml, fn, handle, *args)

    def watts(milliwatts: Any) -> float | None:
        return milliwatts / 1e3 if isinstance(milliwatts, (int, float)) else None

    mask = ask("nvmlDeviceGetCurrentClocksEventReasons")  # the newer name; older drivers know only the other
    if not isinstance(mask, int):
        mask = ask("nvmlDeviceGetCurrentClocksThrottleReasons")
    return {
        "sm_clock_mhz": ask("nvmlDeviceGetClockInfo", NVML_CLOCK_SM),
        "mem_clock_mhz": ask("nvmlDeviceGetClockInfo", NVML_CLOCK_MEM),
        "max_sm_clock_mhz": ask("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM),
        "temperature_c": ask("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU),
        "power_w": watts(ask("nvmlDeviceGetPowerUsage")),
        "power_limit_w": watts(ask("nvmlDeviceGetEnforcedPowerLimit")),
        "throttle_reasons": decode_reasons(mask) if isinstance(mask, int) else None,
    }


def with_nvml(ask: Callable[[Any], Any]) -> Any:
    """ask(pynvml) between NVML's init and shutdown; None where NVML is absent or unusable or `ask` raises."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return ask(pynvml)
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def gpu_state(index: int) -> dict | None:
    """Clocks (MHz), temperature (C), power and its limit (W) and throttle reasons of CUDA device `index` as
    torch numbers it (CUDA_VISIBLE_DEVICES applied), and `nvml_device`: how NVML's device was found (by UUID,
    PCI bus id, or only by index); None where NVML is absent or unusable; a field None where its query is not
    supported. Never raises."""

    def state(nvml: Any) -> dict:
        handle, how = nvml_device(nvml, index)
        return {**nvml_state(nvml, handle), "nvml_device": how}

    return with_nvml(state)


def gpu_memory_bytes(index: int = 0) -> int | None:
    """Total memory of CUDA device `index` from NVML, without starting CUDA in this process; None without NVML."""
    return with_nvml(lambda nvml: int(nvml.nvmlDeviceGetMemoryInfo(nvml_device(nvml, index)[0]).total))


def nvml_device(nvml: Any, index: int) -> tuple[Any, str]:
    """NVML's handle of torch's CUDA device `index` and how it was found. NVML numbers every GPU of the machine,
    CUDA only the visible ones in its own order (cuda:0 under CUDA_VISIBLE_DEVICES=3 is NVML's device 3), so the
    device is matched by what both name alike: the UUID or PCI bus id torch reports (where torch has started CUDA
    in this process), else the CUDA_VISIBLE_DEVICES entry (a UUID or its prefix, or an index), and NVML's index
    `index` only when none of these is there; the returned sentence says which. Raises where NVML has no match."""
    props = _cuda_properties(index)
    for uuid in _uuids(props):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid), f"UUID {uuid}"
        except Exception:
            continue
    if (bus_id := _pci_bus_id(props)) is not None:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(bus_id), f"PCI bus id {bus_id}"
        except Exception:
            pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    entry = visible[index] if 0 <= index < len(visible) else None
    if entry is not None and not entry.isdigit():
        return _by_uuid_prefix(nvml, entry), f"UUID {entry} (CUDA_VISIBLE_DEVICES)"
    nvml_index = int(entry) if entry is not None else index
    source = f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}" if entry is not None else "torch's number"
    why = "CUDA not started in this process" if props is None else "NVML knows neither torch's UUID nor its PCI bus id"
    order = (
        ""
        if os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        else ("; right only if CUDA numbers the GPUs in PCI bus order as NVML does (CUDA_DEVICE_ORDER=PCI_BUS_ID)")
    )
    return nvml.nvmlDeviceGetHandleByIndex(nvml_index), f"index {nvml_index} ({source}; {why}){order}"


def _cuda_properties(index: int) -> Any:
    """torch's properties of CUDA device `index`; None where torch has not started CUDA in this process
    (starting it here would break a parent that forks workers, and hold memory on the GPU being measured)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        return torch.cuda.get_device_properties(index)
    except Exception:
        return None


def _uuids(props: Any) -> list[str]:
    """NVML's spellings of the UUID in torch's properties (torch's has no GPU-/MIG- prefix)."""
    bare = str(getattr(props, "uuid", "") or "")
    if not bare or bare.startswith(("GPU-", "MIG-")):
        return [bare] if bare else []
    return [f"GPU-{bare}", f"MIG-{bare}"]


def _pci_bus_id(props: Any) -> str | None:
    """NVML's domain:bus:device.function from torch's pci_domain_id, pci_bus_id and pci_device_id (CUDA's
    pciDomainID, pciBusID, pciDeviceID); None where torch does not give them."""
    parts = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if not all(isinstance(part, int) and not isinstance(part, bool) for part in parts):
        return None
    return "{:08x}:{:02x}:{:02x}.0".format(*parts)


def _by_uuid_prefix(nvml: Any, entry: str) -> Any:
    """The NVML device a CUDA_VISIBLE_DEVICES UUID entry names: the full UUID, or the one device whose UUID it
    begins (CUDA accepts a unique prefix)."""
    try:
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    except Exception:
        pass
    matches = []
    for handle in map(nvml.nvmlDeviceGetHandleByIndex, range(nvml.nvmlDeviceGetCount())):
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).startswith(entry):
            matches.append(handle)
    if len(matches) != 1:
        raise LookupError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} NVML devices")
    return matches[0]


def throttle_reason(before: dict | None, after: dict | None) -> str | None:
    """A sentence when either snapshot shows the GPU's clocks held down (power cap, thermal, hardware slowdown,
    power brake), naming the reasons, when, and the SM clock against its maximum; None otherwise (idle,
    application clocks and the like do not slow a kernel)."""
    found = []
    for when, state in (("before", before), ("after", after)):
        if limiting := [r for r in (state or {}).get("throttle_reasons") or [] if r in LIMITING]:
            clock, top = state.get("sm_clock_mhz"), state.get("max_sm_clock_mhz")
            speed = f" (SM clock {clock} of {top} MHz)" if clock and top else ""
            found.append(f"{', '.join(limiting)} {when} the point{speed}")
    if not found:
        return None
    return (
        "GPU throttled: " + " and ".join(found) + ", so its timings are not trustworthy: rerun once the GPU "
        "is cool, or check its power limit (nvidia-smi -q -d PERFORMANCE)"
    )


def cpu_cache_bytes(cache_dir: Path = CPU_CACHE_DIR) -> int | None:
    """The largest cache of CPU 0 (the last level) from sysfs sizes such as "32768K"; None where unreadable."""
    sizes = []
    for entry in sorted(cache_dir.glob("index*/size")):
        try:
            text = entry.read_text().strip().upper()
            sizes.append(int(text.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes and max(sizes) > 0 else None


class CacheFlusher:
    """Overwrites a buffer twice the last-level cache (GPU: L2) so the next call starts with a cold cache.
    `nbytes`: the buffer's size; `method`: how, in a sentence for the row's record."""

    def __init__(self, device: str, cache_dir: Path = CPU_CACHE_DIR):
        import torch

        dev = torch.device(device)
        if dev.type == "cuda":
            cache = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or None
            level = "L2"
        else:
            cache, level = cpu_cache_bytes(cache_dir), "last-level cache"
        self.nbytes = 2 * cache if cache else CPU_CACHE_FALLBACK
        self.buffer = torch.empty(self.nbytes, dtype=torch.int8, device=dev)
        size = f"2 x the {cache / 2**20:g} MiB {level}" if cache else "its size was not readable"
        self.method = f"{level} flushed before each timed call: a {self.nbytes / 2**20:g} MiB buffer zeroed ({size})"

    def flush(self) -> None:
        self.buffer.zero_()
