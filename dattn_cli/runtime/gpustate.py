"""The GPU's state around a point (NVML: clocks, temperature, power, the reasons its clocks are held down), and
a cache flusher for cold-cache timing.

A point timed while the GPU was power capped or thermally slowed measures the cooling, not the kernel; NVBench
checks the same throttle reasons. The cold cache follows triton's do_bench, which zeroes a buffer larger than
the L2 before each call so no call finds the previous call's data in cache.
"""

from __future__ import annotations

from pathlib import Path

# NVML's clocks event (throttle) reason bits (nvml.h nvmlClocksEventReason*)
REASONS = {0x1: "idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
           0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks"}
LIMITING = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")  # what slows a kernel
CPU_CACHE_FALLBACK = 64 * 2**20
CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def decode_reasons(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def query(nvml, handle) -> dict:
    def ask(fn, *args, scale: float = 1.0):
        try:
            value = getattr(nvml, fn)(handle, *args)
        except Exception:  # one unsupported query leaves its field empty
            return None
        return value / scale if scale != 1.0 else value

    reasons_fn = ("nvmlDeviceGetCurrentClocksEventReasons" if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                  else "nvmlDeviceGetCurrentClocksThrottleReasons")
    mask = ask(reasons_fn)
    return {"sm_clock_mhz": ask("nvmlDeviceGetClockInfo", 1), "mem_clock_mhz": ask("nvmlDeviceGetClockInfo", 2),
            "max_sm_clock_mhz": ask("nvmlDeviceGetMaxClockInfo", 1),
            "temperature_c": ask("nvmlDeviceGetTemperature", 0), "power_w": ask("nvmlDeviceGetPowerUsage", scale=1e3),
            "power_limit_w": ask("nvmlDeviceGetEnforcedPowerLimit", scale=1e3),
            "throttle_reasons": decode_reasons(mask) if isinstance(mask, int) else None}


def gpu_state(index: int) -> dict | None:
    """Clocks (MHz), temperature (C), power and its limit (W) and throttle reasons of GPU `index`; None where
    NVML is absent or unusable; a field None where its query is not supported. Never raises."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return query(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def throttle_reason(before: dict | None, after: dict | None) -> str | None:
    """A sentence when the GPU's clocks were held down (power cap, thermal, hardware slowdown) before or after
    the point; None otherwise (idle, application clocks and the like do not slow a kernel)."""
    found = []
    for when, state in (("before", before), ("after", after)):
        limiting = [r for r in (state or {}).get("throttle_reasons") or [] if r in LIMITING]
        if limiting:
            clock, top = state.get("sm_clock_mhz"), state.get("max_sm_clock_mhz")
            speed = f", SM clock {clock} of {top} MHz" if clock and top else ""
            found.append(f"{', '.join(limiting)} {when} the point{speed}")
    return ("GPU throttled: " + "; ".join(found)) if found else None


def cpu_cache_bytes(cache_dir: Path = CPU_CACHE_DIR) -> int:
    """The largest cache of CPU 0 (the last level), from sysfs; CPU_CACHE_FALLBACK where unreadable."""
    sizes = []
    for entry in sorted(cache_dir.glob("index*/size")):
        try:
            text = entry.read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else CPU_CACHE_FALLBACK


class CacheFlusher:
    """Overwrites a buffer twice the last-level cache (GPU: L2) so the next call starts with a cold cache."""

    def __init__(self, device: str, cache_dir: Path = CPU_CACHE_DIR):
        import torch

        if device.startswith("cuda"):
            cache = torch.cuda.get_device_properties(torch.device(device)).L2_cache_size
            level = "L2"
        else:
            cache, level = cpu_cache_bytes(cache_dir), "last-level cache"
        self.nbytes = 2 * cache
        self.buffer = torch.empty(self.nbytes, dtype=torch.int8, device=device)
        self.method = (f"{level} flushed before each timed call: a {self.nbytes / 2**20:.0f} MiB buffer zeroed "
                       f"(2 x the {cache / 2**20:.0f} MiB {level})")

    def flush(self) -> None:
        self.buffer.zero_()
