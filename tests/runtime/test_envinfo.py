"""The environment record's comparability facts: torch threads, the load average (runtime.contention's) and,
per NVIDIA device, its SM clock, maximum SM clock and power limit (runtime.gpustate's NVML state), its UUID and
PCI bus id, and which torch CUDA index it is (matched as runtime.gpustate matches it)."""

import os
import sys
import types

import torch

from dattn_cli.runtime.envinfo import collect_environment, comparability_facts
from tests.runtime.test_gpustate import bus_id_of, cuda_started, fake_nvml, uuid_of


def nvml_with_devices(fail: tuple[str, ...] = (), devices: int = 1):
    nvml = fake_nvml(fail=fail, devices=devices)

    class NVMLError(Exception):
        pass

    nvml.NVMLError = NVMLError
    nvml.nvmlSystemGetDriverVersion = lambda: b"570.86"
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H100"
    nvml.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus_id_of(h).encode())
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


def test_each_gpu_records_which_cuda_device_it_is_under_cuda_visible_devices(monkeypatch):
    """NVML lists the machine's 4 GPUs; with CUDA_VISIBLE_DEVICES=3 torch's only device, cuda:0, is NVML's 3."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml_with_devices(devices=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cuda_started(monkeypatch, uuid=uuid_of(3).removeprefix("GPU-"))
    devices = collect_environment().nvidia_devices
    assert [(d.index, d.uuid, d.pci_bus_id, d.cuda_index) for d in devices] == [
        (i, uuid_of(i), bus_id_of(i), 0 if i == 3 else None) for i in range(4)
    ]
    assert devices[3].cuda_match == f"UUID {uuid_of(3)}" and devices[0].cuda_match is None


def test_without_cuda_started_the_match_is_by_index_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", nvml_with_devices(devices=4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    devices = collect_environment().nvidia_devices
    assert [d.cuda_index for d in devices] == [1, None, 0, None]
    assert devices[2].cuda_match.startswith("index 2 (CUDA_VISIBLE_DEVICES=2,0; CUDA not started in this process)")


def test_a_cpu_only_torch_gives_no_cuda_index(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", nvml_with_devices(devices=2))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert [d.cuda_index for d in collect_environment().nvidia_devices] == [None, None]


def test_the_record_holds_the_block_kernel_choice_and_the_cached_probes(monkeypatch, tmp_path):
    """`dattn env`: DATTN_BLOCK_KERNEL, and each cached probe for this torch with its choice per backend, timings
    and compile seconds (kernels/kernel_choice.py); the table shows them."""
    import json

    from dattn_cli.cli.render.env import env_table
    from dattn_cli.kernels import kernel_choice

    monkeypatch.setenv("DATTN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DATTN_BLOCK_KERNEL", "fa2")
    facts = {"gpu": "NVIDIA H100 80GB HBM3", **kernel_choice.versions(), "dtype": "bfloat16", "head_dim": 64}
    kernels = {"cudnn": {"ms": 1.0, "compile_s": 0.2}, "fa2": {"ms": 1.4, "compile_s": 0.0}}
    entry = {"facts": facts, "kernels": kernels, "probed_at": "2026-11-26T15:00:00+00:00"}
    other = {**entry, "facts": {**facts, "torch": "1.0"}}  # another torch's probe: not this one's
    entries = {kernel_choice.probe_key(facts): entry, kernel_choice.probe_key(other["facts"]): other}
    (tmp_path / "block_kernels.json").write_text(json.dumps({"format": kernel_choice.CACHE_FORMAT, "entries": entries}))
    info = collect_environment()
    assert info.block_kernel_forced == "fa2"
    (probe,) = info.block_kernels
    assert (probe["sdpa"], probe["flash"], probe["auto"]) == ("cudnn", None, "cudnn")
    assert probe["timings_ms"] == {"cudnn": 1.0, "fa2": 1.4} and probe["compile_s"]["cudnn"] == 0.2
    rows = dict(zip(*(list(column.cells) for column in env_table(info).columns)))
    assert rows["block kernel forced"] == "fa2"
    assert "sdpa -> cudnn" in rows["block kernel (NVIDIA H100 80GB HBM3, bfloat16, D=64)"]
    monkeypatch.setenv("DATTN_BLOCK_KERNEL", "nonsense")
    assert collect_environment().block_kernel_forced.startswith("invalid: DATTN_BLOCK_KERNEL='nonsense'")
