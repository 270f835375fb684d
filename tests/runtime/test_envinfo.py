"""The environment record's comparability facts: torch threads, the load average (runtime.contention's) and,
per NVIDIA device, its SM clock, maximum SM clock and power limit (runtime.gpustate's NVML state)."""

import os
import sys
import types

import torch

from dattn_cli.runtime.envinfo import collect_environment, comparability_facts
from tests.runtime.test_gpustate import fake_nvml


def nvml_with_devices(fail: tuple[str, ...] = ()):
    nvml = fake_nvml(fail=fail)

    class NVMLError(Exception):
        pass

    nvml.NVMLError = NVMLError
    nvml.nvmlSystemGetDriverVersion = lambda: b"570.86"
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30, used=2**30)
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H100"
    return nvml


def test_the_record_holds_threads_and_load(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (2.345, 1.0, 0.5))
    facts = comparability_facts()
    assert facts["torch_threads"] == torch.get_num_threads() and facts["load_average"] == [2.35, 1.0, 0.5]


def test_each_nvidia_device_records_its_clocks_and_power_limit(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", nvml_with_devices())
    info = collect_environment()
    assert info.nvml_status == "1 NVIDIA device(s)" and info.nvidia_driver == "570.86"
    device = info.nvidia_devices[0]
    assert (device.sm_clock_mhz, device.max_sm_clock_mhz, device.power_limit_w) == (1410, 1980, 700.0)
    assert info.torch_threads == torch.get_num_threads()


def test_what_nvml_does_not_say_stays_empty(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", nvml_with_devices(fail=("nvmlDeviceGetEnforcedPowerLimit",)))
    device = collect_environment().nvidia_devices[0]
    assert device.power_limit_w is None and device.sm_clock_mhz == 1410
