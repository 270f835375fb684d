"""runtime.gpustate with a fake pynvml (decoding, failing queries, throttle reasons) and the cache flusher on CPU."""

import sys
import types

import pytest
import torch

from dattn_cli.runtime.gpustate import CacheFlusher, cpu_cache_bytes, gpu_state, throttle_reason


def fake_nvml(mask: int = 0x4 | 0x1, fail: tuple[str, ...] = ()):
    nvml = types.ModuleType("pynvml")

    def answer(name, value):
        def call(*args):
            if name in fail:
                raise RuntimeError("not supported")
            return value(*args) if callable(value) else value
        return call

    for name, value in {"nvmlInit": None, "nvmlShutdown": None, "nvmlDeviceGetHandleByIndex": "handle",
                        "nvmlDeviceGetClockInfo": lambda h, kind: {1: 1410, 2: 1593}[kind],
                        "nvmlDeviceGetMaxClockInfo": lambda h, kind: 1980, "nvmlDeviceGetTemperature": 71,
                        "nvmlDeviceGetPowerUsage": 412_000, "nvmlDeviceGetEnforcedPowerLimit": 700_000,
                        "nvmlDeviceGetCurrentClocksEventReasons": mask}.items():
        setattr(nvml, name, answer(name, value))
    return nvml


def test_state_and_reasons_decoded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    state = gpu_state(0)
    assert state == {"sm_clock_mhz": 1410, "mem_clock_mhz": 1593, "max_sm_clock_mhz": 1980, "temperature_c": 71,
                     "power_w": 412.0, "power_limit_w": 700.0, "throttle_reasons": ["idle", "sw_power_cap"]}


def test_an_unsupported_query_leaves_its_field_empty(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=("nvmlDeviceGetTemperature",)))
    state = gpu_state(0)
    assert state["temperature_c"] is None and state["sm_clock_mhz"] == 1410


def test_no_nvml_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=("nvmlInit",)))
    assert gpu_state(0) is None


def test_only_clock_limiting_reasons_count():
    idle = {"throttle_reasons": ["idle", "applications_clocks"], "sm_clock_mhz": 345, "max_sm_clock_mhz": 1980}
    capped = {"throttle_reasons": ["sw_power_cap", "hw_thermal"], "sm_clock_mhz": 1200, "max_sm_clock_mhz": 1980}
    assert throttle_reason(idle, idle) is None and throttle_reason(None, None) is None
    reason = throttle_reason(idle, capped)
    assert reason == "GPU throttled: sw_power_cap, hw_thermal after the point, SM clock 1200 of 1980 MHz"


def test_cpu_cache_size_from_sysfs(tmp_path):
    for index, size in enumerate(("32K", "512K", "32768K")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert cpu_cache_bytes(tmp_path) == 32 * 2**20
    assert cpu_cache_bytes(tmp_path / "missing") == 64 * 2**20


def test_the_cpu_flusher_overwrites_twice_the_last_level_cache(tmp_path):
    (tmp_path / "index3").mkdir()
    (tmp_path / "index3" / "size").write_text("1024K\n")
    flusher = CacheFlusher("cpu", cache_dir=tmp_path)
    assert flusher.nbytes == 2 * 2**20 and "2 MiB buffer zeroed" in flusher.method
    flusher.buffer.fill_(7)
    flusher.flush()
    assert int(flusher.buffer.abs().sum()) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_flusher_covers_the_l2():
    flusher = CacheFlusher("cuda")
    assert flusher.nbytes == 2 * torch.cuda.get_device_properties(0).L2_cache_size and flusher.buffer.is_cuda
    flusher.flush()
