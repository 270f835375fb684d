"""runtime.gpustate with a fake pynvml (decoding, failing queries, which device, throttle reasons) and the cache
flusher on CPU (on CUDA where there is one)."""

import sys
import types

import pytest
import torch

from dattn_cli.runtime import gpustate
from dattn_cli.runtime.gpustate import CacheFlusher, cpu_cache_bytes, decode_reasons, gpu_state, throttle_reason

EVENT_REASONS = "nvmlDeviceGetCurrentClocksEventReasons"


def fake_nvml(mask: int = 0x4 | 0x1, fail: tuple[str, ...] = (), asked: list | None = None):
    """A pynvml stand-in answering for one GPU; the functions named in `fail` raise; handle lookups go to `asked`."""
    nvml = types.ModuleType("pynvml")
    asked = [] if asked is None else asked

    def answer(name, value):
        def call(*args):
            if name in fail:
                raise RuntimeError("not supported")
            if name.startswith("nvmlDeviceGetHandleBy"):
                asked.append(args[0])
            return value(*args) if callable(value) else value
        return call

    for name, value in {"nvmlInit": None, "nvmlShutdown": None, "nvmlDeviceGetHandleByIndex": "handle",
                        "nvmlDeviceGetHandleByUUID": "handle",
                        "nvmlDeviceGetClockInfo": lambda h, kind: {1: 1410, 2: 1593}[kind],
                        "nvmlDeviceGetMaxClockInfo": lambda h, kind: {1: 1980, 2: 2619}[kind],
                        "nvmlDeviceGetTemperature": 71, "nvmlDeviceGetPowerUsage": 412_000,
                        "nvmlDeviceGetEnforcedPowerLimit": 700_000, EVENT_REASONS: mask,
                        "nvmlDeviceGetCurrentClocksThrottleReasons": 0x20}.items():
        setattr(nvml, name, answer(name, value))
    return nvml


def test_state_and_reasons_decoded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    assert gpu_state(0) == {"sm_clock_mhz": 1410, "mem_clock_mhz": 1593, "max_sm_clock_mhz": 1980,
                            "temperature_c": 71, "power_w": 412.0, "power_limit_w": 700.0,
                            "throttle_reasons": ["idle", "sw_power_cap"]}


def test_every_reason_bit_has_a_name_and_unknown_bits_keep_theirs():
    assert decode_reasons(0x7FF) == ["idle", "applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost",
                                     "sw_thermal", "hw_thermal", "hw_power_brake", "display_clocks", "board_limit",
                                     "reliability"]
    assert decode_reasons(0) == [] and decode_reasons(0x1000 | 0x8) == ["hw_slowdown", "0x1000"]


@pytest.mark.parametrize("fail,field", [("nvmlDeviceGetTemperature", "temperature_c"),
                                        ("nvmlDeviceGetEnforcedPowerLimit", "power_limit_w"),
                                        ("nvmlDeviceGetClockInfo", "sm_clock_mhz")])
def test_an_unsupported_query_leaves_its_field_empty(monkeypatch, fail, field):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=(fail,)))
    state = gpu_state(0)
    assert state[field] is None and state["max_sm_clock_mhz"] == 1980 and state["throttle_reasons"]


def test_a_driver_without_event_reasons_falls_back_to_throttle_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=(EVENT_REASONS,)))
    assert gpu_state(0)["throttle_reasons"] == ["sw_thermal"]
    neither = (EVENT_REASONS, "nvmlDeviceGetCurrentClocksThrottleReasons")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=neither))
    assert gpu_state(0)["throttle_reasons"] is None


@pytest.mark.parametrize("nvml", [None, fake_nvml(fail=("nvmlInit",)),
                                  fake_nvml(fail=("nvmlDeviceGetHandleByIndex",))],
                         ids=["not-installed", "no-driver", "no-such-device"])
def test_no_usable_nvml_is_none(monkeypatch, nvml):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: `import pynvml` raises ImportError
    assert gpu_state(0) is None


def test_the_device_is_cudas_not_nvmls_numbering(monkeypatch):
    asked = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(asked=asked))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    gpu_state(1)  # CUDA's device 1 is the machine's GPU 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e7b,GPU-9a01")
    gpu_state(1)  # UUIDs in the list, CUDA not started: NVML's index is the best guess left
    assert asked == [2, 1]


def test_with_cuda_started_the_device_is_found_by_its_uuid(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="5e7b-77"))
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(asked=asked))
    assert gpu_state(0) is not None and asked == ["GPU-5e7b-77"]
    asked.clear()
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(asked=asked, fail=("nvmlDeviceGetHandleByUUID",)))
    assert gpu_state(0) is not None and asked == [0]  # no UUID lookup: back to the index


IDLE = {"throttle_reasons": ["idle", "applications_clocks", "display_clocks", "sync_boost"], "sm_clock_mhz": 345,
        "max_sm_clock_mhz": 1980}
CAPPED = {"throttle_reasons": ["sw_power_cap", "hw_thermal"], "sm_clock_mhz": 1200, "max_sm_clock_mhz": 1980}


@pytest.mark.parametrize("before,after", [(IDLE, IDLE), (None, None), (None, IDLE), ({}, {"throttle_reasons": None})])
def test_only_clock_limiting_reasons_count(before, after):
    assert throttle_reason(before, after) is None


def test_the_throttle_sentence_names_the_reasons_when_and_the_clock():
    assert throttle_reason(IDLE, CAPPED).startswith(
        "GPU throttled: sw_power_cap, hw_thermal after the point (SM clock 1200 of 1980 MHz), so its timings are "
        "not trustworthy")
    both = throttle_reason({"throttle_reasons": ["hw_power_brake"]}, CAPPED)
    assert both.startswith("GPU throttled: hw_power_brake before the point and sw_power_cap, hw_thermal after")
    assert throttle_reason(CAPPED, None).startswith("GPU throttled: sw_power_cap, hw_thermal before the point (SM")


def cache_dir(tmp_path, *sizes):
    for index, size in enumerate(sizes):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    return tmp_path


def test_cpu_cache_size_from_sysfs(tmp_path):
    assert cpu_cache_bytes(cache_dir(tmp_path, "32K", "32K", "512K", "32768K")) == 32 * 2**20
    assert cpu_cache_bytes(tmp_path / "missing") is None


def test_the_cpu_flusher_overwrites_twice_the_last_level_cache(tmp_path):
    flusher = CacheFlusher("cpu", cache_dir=cache_dir(tmp_path, "48K", "1M"))
    assert flusher.nbytes == 2 * 2**20 and flusher.buffer.numel() == flusher.nbytes
    assert flusher.method == ("last-level cache flushed before each timed call: a 2 MiB buffer zeroed "
                              "(2 x the 1 MiB last-level cache)")
    flusher.buffer.fill_(7)
    flusher.flush()
    assert not flusher.buffer.any()


def test_an_unreadable_cpu_cache_size_flushes_64_mib(tmp_path):
    flusher = CacheFlusher("cpu", cache_dir=tmp_path / "missing")
    assert flusher.nbytes == gpustate.CPU_CACHE_FALLBACK == 64 * 2**20 and "not readable" in flusher.method


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_flusher_covers_the_l2():
    flusher = CacheFlusher("cuda")
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    assert flusher.nbytes == 2 * l2 and flusher.buffer.is_cuda and "L2 flushed" in flusher.method
    flusher.buffer.fill_(7)
    flusher.flush()
    assert not flusher.buffer.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_real_gpu_state_has_every_field():
    torch.zeros(1, device="cuda")  # CUDA started: the device is found by its UUID
    state = gpu_state(torch.cuda.current_device())
    if state is None:
        pytest.skip("NVML is not usable here")
    assert set(state) == {"sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz", "temperature_c", "power_w",
                          "power_limit_w", "throttle_reasons"}
    assert isinstance(state["throttle_reasons"], list)
