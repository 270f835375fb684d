"""runtime.gpustate with a fake pynvml and fake torch.cuda device properties (decoding, failing queries, which
NVML device is torch's: by UUID, PCI bus id, CUDA_VISIBLE_DEVICES; throttle reasons) and the cache flusher on CPU
(on CUDA where there is one)."""

import sys
import types

import pytest
import torch

from dattn_cli.runtime import gpustate
from dattn_cli.runtime.gpustate import CacheFlusher, cpu_cache_bytes, decode_reasons, gpu_state, throttle_reason
from dattn_cli.runtime.measure import nvml_used_bytes

EVENT_REASONS = "nvmlDeviceGetCurrentClocksEventReasons"


def uuid_of(device: int) -> str:
    return f"GPU-000{device}-5e7b-77"


def bus_id_of(device: int) -> str:
    return f"00000000:{0x18 + device:02X}:00.0"


def fake_nvml(mask: int = 0x4 | 0x1, fail: tuple[str, ...] = (), asked: list | None = None, devices: int = 1):
    """A pynvml stand-in answering for `devices` GPUs (handle = NVML index; device i: UUID uuid_of(i), PCI bus id
    bus_id_of(i), temperature 70 + i, (i + 1) GiB used); the functions named in `fail` raise; handle lookups
    go to `asked` as (function, argument)."""
    nvml = types.ModuleType("pynvml")
    asked = [] if asked is None else asked

    def by_index(i):
        if not 0 <= i < devices:
            raise RuntimeError("invalid argument")
        return i

    def by_uuid(uuid):
        return by_index(next((i for i in range(devices) if uuid_of(i) == uuid), -1))

    def by_bus(bus):
        domain, bus_number, rest = bus.split(":")
        return by_index(int(bus_number, 16) - 0x18 if int(domain, 16) == 0 and rest == "00.0" else -1)

    def answer(name, value):
        def call(*args):
            if name in fail:
                raise RuntimeError("not supported")
            if name.startswith("nvmlDeviceGetHandleBy"):
                asked.append((name.removeprefix("nvmlDeviceGetHandleBy"), args[0]))
            return value(*args) if callable(value) else value

        return call

    for name, value in {
        "nvmlInit": None,
        "nvmlShutdown": None,
        "nvmlDeviceGetCount": devices,
        "nvmlDeviceGetHandleByIndex": by_index,
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetHandleByPciBusId": by_bus,
        "nvmlDeviceGetUUID": uuid_of,
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(total=80 * 2**30, used=(h + 1) * 2**30),
        "nvmlDeviceGetClockInfo": lambda h, kind: {1: 1410, 2: 1593}[kind],
        "nvmlDeviceGetMaxClockInfo": lambda h, kind: {1: 1980, 2: 2619}[kind],
        "nvmlDeviceGetTemperature": lambda h, kind: 70 + h,
        "nvmlDeviceGetPowerUsage": 412_000,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        EVENT_REASONS: mask,
        "nvmlDeviceGetCurrentClocksThrottleReasons": 0x20,
    }.items():
        setattr(nvml, name, answer(name, value))
    return nvml


def cuda_started(monkeypatch, **properties):
    """torch as if CUDA were up in this process, every device with these properties (uuid, pci_*_id)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(**properties))


@pytest.fixture(autouse=True)
def _no_launcher_devices(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)


def test_state_and_reasons_decoded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    state = gpu_state(0)
    assert state.pop("nvml_device").startswith("index 0 (torch's number; CUDA not started in this process)")
    assert state == {
        "sm_clock_mhz": 1410,
        "mem_clock_mhz": 1593,
        "max_sm_clock_mhz": 1980,
        "temperature_c": 70,
        "power_w": 412.0,
        "power_limit_w": 700.0,
        "throttle_reasons": ["idle", "sw_power_cap"],
    }


def test_every_reason_bit_has_a_name_and_unknown_bits_keep_theirs():
    assert decode_reasons(0x7FF) == [
        "idle",
        "applications_clocks",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal",
        "hw_thermal",
        "hw_power_brake",
        "display_clocks",
        "board_limit",
        "reliability",
    ]
    assert decode_reasons(0) == [] and decode_reasons(0x1000 | 0x8) == ["hw_slowdown", "0x1000"]


@pytest.mark.parametrize(
    "fail,field",
    [
        ("nvmlDeviceGetTemperature", "temperature_c"),
        ("nvmlDeviceGetEnforcedPowerLimit", "power_limit_w"),
        ("nvmlDeviceGetClockInfo", "sm_clock_mhz"),
    ],
)
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


@pytest.mark.parametrize(
    "nvml",
    [None, fake_nvml(fail=("nvmlInit",)), fake_nvml(devices=0)],
    ids=["not-installed", "no-driver", "no-such-device"],
)
def test_no_usable_nvml_is_none(monkeypatch, nvml):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: `import pynvml` raises ImportError
    assert gpu_state(0) is None


def test_cuda_visible_devices_3_makes_cuda_0_nvml_device_3_by_uuid(monkeypatch):
    """CUDA started: torch's UUID of cuda:0 is NVML device 3's, found without any index."""
    asked = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(asked=asked, devices=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    cuda_started(
        monkeypatch, uuid=uuid_of(3).removeprefix("GPU-"), pci_domain_id=0, pci_bus_id=0x18 + 3, pci_device_id=0
    )
    state = gpu_state(0)
    assert state["temperature_c"] == 73 and state["nvml_device"] == f"UUID {uuid_of(3)}"
    assert asked == [("UUID", uuid_of(3))]
    assert nvml_used_bytes(0) == 4 * 2**30


def test_without_a_uuid_the_pci_bus_id_finds_the_device(monkeypatch):
    asked = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(asked=asked, devices=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    cuda_started(monkeypatch, uuid="", pci_domain_id=0, pci_bus_id=0x18 + 3, pci_device_id=0)
    state = gpu_state(0)
    assert state["temperature_c"] == 73 and state["nvml_device"] == "PCI bus id 00000000:1b:00.0"
    assert asked == [("PciBusId", "00000000:1b:00.0")]


def test_a_uuid_nvml_does_not_know_falls_back_to_the_pci_bus_id(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(devices=4))
    cuda_started(monkeypatch, uuid="ffff-0000", pci_domain_id=0, pci_bus_id=0x18 + 2, pci_device_id=0)
    assert gpu_state(0)["temperature_c"] == 72


def test_without_torch_ids_the_visible_devices_index_is_used_and_the_record_says_so(monkeypatch):
    asked = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(asked=asked, devices=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    state = gpu_state(1)  # CUDA not started here: no UUID or PCI bus id from torch
    assert state["temperature_c"] == 72 and asked == [("Index", 2)]
    assert state["nvml_device"] == (
        "index 2 (CUDA_VISIBLE_DEVICES=3,2; CUDA not started in this process); right "
        "only if CUDA numbers the GPUs in PCI bus order as NVML does "
        "(CUDA_DEVICE_ORDER=PCI_BUS_ID)"
    )
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert gpu_state(0)["nvml_device"] == "index 3 (CUDA_VISIBLE_DEVICES=3,2; CUDA not started in this process)"
    assert nvml_used_bytes(0) == 4 * 2**30


def test_torch_properties_without_ids_fall_back_to_the_index_and_say_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(devices=4))
    cuda_started(monkeypatch, name="old torch: no uuid, no pci ids")
    state = gpu_state(2)
    assert state["temperature_c"] == 72
    assert state["nvml_device"].startswith("index 2 (torch's number; NVML knows neither torch's UUID nor its PCI")


@pytest.mark.parametrize("entry,device", [(uuid_of(2), 2), ("GPU-0003", 3)], ids=["full", "prefix"])
def test_a_uuid_in_cuda_visible_devices_is_matched_by_uuid(monkeypatch, entry, device):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(devices=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{entry},GPU-0001")
    state = gpu_state(0)
    assert state["temperature_c"] == 70 + device and state["nvml_device"] == f"UUID {entry} (CUDA_VISIBLE_DEVICES)"


def test_an_ambiguous_uuid_prefix_reads_no_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(devices=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-000")
    assert gpu_state(0) is None and nvml_used_bytes(0) is None


IDLE = {
    "throttle_reasons": ["idle", "applications_clocks", "display_clocks", "sync_boost"],
    "sm_clock_mhz": 345,
    "max_sm_clock_mhz": 1980,
}
CAPPED = {"throttle_reasons": ["sw_power_cap", "hw_thermal"], "sm_clock_mhz": 1200, "max_sm_clock_mhz": 1980}


@pytest.mark.parametrize("before,after", [(IDLE, IDLE), (None, None), (None, IDLE), ({}, {"throttle_reasons": None})])
def test_only_clock_limiting_reasons_count(before, after):
    assert throttle_reason(before, after) is None


def test_the_throttle_sentence_names_the_reasons_when_and_the_clock():
    assert throttle_reason(IDLE, CAPPED).startswith(
        "GPU throttled: sw_power_cap, hw_thermal after the point (SM clock 1200 of 1980 MHz), so its timings are "
        "not trustworthy"
    )
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
    assert flusher.method == (
        "last-level cache flushed before each timed call: a 2 MiB buffer zeroed (2 x the 1 MiB last-level cache)"
    )
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
    assert set(state) == {
        "sm_clock_mhz",
        "mem_clock_mhz",
        "max_sm_clock_mhz",
        "temperature_c",
        "power_w",
        "power_limit_w",
        "throttle_reasons",
        "nvml_device",
    }
    assert state["nvml_device"].startswith(("UUID", "PCI bus id")), state["nvml_device"]
    assert isinstance(state["throttle_reasons"], list)
