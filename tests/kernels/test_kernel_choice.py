"""kernel_choice.py on CPU: the probe's disk cache (written, read back, corrupt, a changed key), the choice per
backend from its timings, DATTN_BLOCK_KERNEL, and what `dattn env` reads back; timings from a fake measure."""

import json

import pytest
import torch

import dattn_cli.kernels.kernel_choice as kc

FACTS = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "cudnn": 91000, "fa4": "4.0.0b36", "flash-attn": None}
TIMINGS = {"cudnn": 1.0, "fa2": 1.5, "fa4": 0.8, "flash-attn2": None}


class FakeMeasure:
    def __init__(self, timings=TIMINGS):
        self.timings, self.calls = timings, []

    def __call__(self, name):
        self.calls.append(name)
        ms = self.timings.get(name)
        return {"ms": ms, "compile_s": 30.0 if name == "fa4" else 0.1, "error": None if ms else "RuntimeError: no"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DATTN_BLOCK_KERNEL", raising=False)
    monkeypatch.setattr(kc, "_MEMO", {})
    monkeypatch.setattr(kc, "_CHOICE", {})
    return tmp_path / "cache" / "block_kernels.json"


def facts(**changed):
    return {**FACTS, "dtype": "bfloat16", "head_dim": 64, **changed}


def test_cache_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("DATTN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kc.cache_path() == tmp_path / "dattn" / "block_kernels.json"
    monkeypatch.setenv("DATTN_CACHE_DIR", str(tmp_path / "here"))
    assert kc.cache_path() == tmp_path / "here" / "block_kernels.json"


def test_a_probe_is_written_and_read_back_without_measuring_again(cache, monkeypatch):
    measure = FakeMeasure()
    names = ("cudnn", "fa2", "fa4", "flash-attn2")
    entry = kc.probe_entry(facts(), names, measure)
    assert measure.calls == list(names) and cache.exists()
    data = json.loads(cache.read_text())
    assert data["format"] == kc.CACHE_FORMAT and list(data["entries"]) == [kc.probe_key(facts())]
    assert entry["kernels"]["fa4"] == {"ms": 0.8, "compile_s": 30.0, "error": None}
    monkeypatch.setattr(kc, "_MEMO", {})  # another process: reads the file
    again = FakeMeasure()
    assert kc.probe_entry(facts(), names, again) == entry and again.calls == []


def test_a_kernel_that_failed_to_import_is_probed_again_by_the_next_process(cache, monkeypatch):
    """On the H100 run FA4 was found but did not import (`cutlass` missing from sys.path); once mended, the next
    process must probe it, not read the failure back from the disk."""

    class BrokenFa4(FakeMeasure):
        def __call__(self, name):
            if name == "fa4":
                self.calls.append(name)
                return {"ms": None, "compile_s": None, "error": "ModuleNotFoundError: No module named 'cutlass'"}
            return super().__call__(name)

    names = ("cudnn", "fa4")
    assert kc.fastest(kc.probe_entry(facts(), names, BrokenFa4()), names) == "cudnn"
    assert not cache.exists()  # kept in this process only
    monkeypatch.setattr(kc, "_MEMO", {})
    mended = FakeMeasure()
    assert kc.fastest(kc.probe_entry(facts(), names, mended), names) == "fa4" and mended.calls == list(names)
    assert cache.exists()


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": 0, "entries": {}}', '{"format": 1, "entries": 3}'])
def test_a_corrupt_cache_is_probed_again_and_rewritten(cache, content):
    cache.parent.mkdir(parents=True)
    cache.write_text(content)
    measure = FakeMeasure()
    kc.probe_entry(facts(), ("cudnn", "fa2"), measure)
    assert measure.calls == ["cudnn", "fa2"]
    assert kc.read_cache(cache)[kc.probe_key(facts())]["kernels"]["fa2"]["ms"] == 1.5


def test_a_bad_entry_is_dropped_and_its_key_probed_again(cache):
    cache.parent.mkdir(parents=True)
    good, bad = kc.probe_key(facts(head_dim=128)), kc.probe_key(facts())
    entries = {good: {"kernels": {"fa2": {"ms": 2.0}}}, bad: {"kernels": {"fa2": {"ms": "fast"}}}}
    cache.write_text(json.dumps({"format": kc.CACHE_FORMAT, "entries": entries}))
    assert list(kc.read_cache(cache)) == [good]
    measure = FakeMeasure()
    kc.probe_entry(facts(), ("fa2",), measure)
    assert measure.calls == ["fa2"] and set(kc.read_cache(cache)) == {good, bad}


@pytest.mark.parametrize("change", [{"torch": "2.14.0"}, {"cudnn": 91100}, {"fa4": "4.0.0b40"}, {"gpu": "NVIDIA H200"},
                                    {"dtype": "float16"}, {"head_dim": 128}])  # fmt: skip
def test_a_changed_key_is_probed_and_kept_beside_the_old(cache, monkeypatch, change):
    kc.probe_entry(facts(), ("fa2",), FakeMeasure())
    monkeypatch.setattr(kc, "_MEMO", {})
    measure = FakeMeasure()
    kc.probe_entry(facts(**change), ("fa2",), measure)
    assert measure.calls == ["fa2"] and len(kc.read_cache(cache)) == 2


def test_a_new_candidate_is_probed(cache, monkeypatch):
    kc.probe_entry(facts(), ("cudnn", "fa2"), FakeMeasure())
    monkeypatch.setattr(kc, "_MEMO", {})
    measure = FakeMeasure()
    entry = kc.probe_entry(facts(), ("cudnn", "fa2", "fa4"), measure)
    assert measure.calls == ["cudnn", "fa2", "fa4"] and set(entry["kernels"]) == {"cudnn", "fa2", "fa4"}


def test_fastest_takes_the_quickest_correct_kernel():
    entry = {"kernels": {name: {"ms": ms} for name, ms in TIMINGS.items()}}
    assert kc.fastest(entry, ("cudnn", "fa2")) == "cudnn"
    assert kc.fastest(entry, ("cudnn", "fa2", "fa4", "flash-attn2")) == "fa4"
    assert kc.fastest(entry, ("flash-attn2",)) is None  # failed its probe: never chosen


@pytest.fixture
def fake_gpu(cache, monkeypatch):
    """A CUDA machine with cuDNN, the FA2 op and FA4 (no flash-attn 2), whose kernels time as TIMINGS say."""
    measure = FakeMeasure()
    monkeypatch.setattr(kc, "available", lambda name: name != "flash-attn2")
    monkeypatch.setattr(kc, "versions", lambda: {k: FACTS[k] for k in ("torch", "cudnn", "fa4", "flash-attn")})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: FACTS["gpu"])
    monkeypatch.setattr(kc, "measure_kernel", lambda name, device, dtype, head_dim: measure(name))
    return measure


def test_each_backend_chooses_the_fastest_of_its_family_from_one_probe(fake_gpu):
    device = torch.device("cuda", 0)
    assert kc.choose_kernel("sdpa", device, torch.bfloat16, 64) == "cudnn"
    assert kc.choose_kernel("auto", device, torch.bfloat16, 64) == "fa4"
    assert kc.choose_kernel("flash", device, torch.bfloat16, 64) == "fa4"  # the only one installed: no probe needed
    assert fake_gpu.calls == ["cudnn", "fa2", "fa4"]  # one probe of every available kernel, for all families
    (choice,) = kc.cached_choices()
    assert (choice["sdpa"], choice["flash"], choice["auto"]) == ("cudnn", "fa4", "fa4")
    assert choice["compile_s"]["fa4"] == 30.0 and choice["dtype"] == "bfloat16" and choice["head_dim"] == 64
    assert kc.expected_kernels(cuda=True) == {"math": "math", "sdpa": "cudnn", "flash": "fa4"}


def test_when_every_candidate_fails_sdpa_falls_back_to_the_fa2_op(fake_gpu, monkeypatch):
    fake_gpu.timings = {}
    assert kc.choose_kernel("sdpa", torch.device("cuda", 0), torch.float16, 64) == "fa2"


def test_dattn_block_kernel_forces_a_kernel(fake_gpu, monkeypatch):
    monkeypatch.setenv("DATTN_BLOCK_KERNEL", "fa2")
    assert kc.choose_kernel("auto", torch.device("cuda", 0), torch.bfloat16, 64) == "fa2"
    assert kc.choose_kernel("flash", torch.device("cuda", 0), torch.bfloat16, 64) == "fa2"  # whatever the backend
    assert fake_gpu.calls == []  # forced: nothing probed
    monkeypatch.setenv("DATTN_BLOCK_KERNEL", "flash-attn2")
    with pytest.raises(ValueError, match="DATTN_BLOCK_KERNEL=flash-attn2 is not available here"):
        kc.choose_kernel("sdpa", torch.device("cuda", 0), torch.bfloat16, 64)
    monkeypatch.setenv("DATTN_BLOCK_KERNEL", "fastest")
    with pytest.raises(ValueError, match="DATTN_BLOCK_KERNEL='fastest' is unknown: use auto or one of cudnn, fa2"):
        kc.choose_kernel("sdpa", torch.device("cuda", 0), torch.bfloat16, 64)
    monkeypatch.setenv("DATTN_BLOCK_KERNEL", "auto")
    assert kc.forced_kernel() is None


def test_ensure_probed_probes_only_where_a_choice_is_open_and_warms_the_kernel(fake_gpu, monkeypatch):
    warmed = []
    monkeypatch.setattr(kc, "_block_inputs", lambda *a, **k: [None] * 4)
    monkeypatch.setattr(kc, "_run_kernel", lambda name, q, k, v, dout, causal: warmed.append((name, causal)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert kc.ensure_probed("cpu", "bfloat16", 64) is None
    assert kc.ensure_probed("cuda", "float32", 64) is None
    assert kc.ensure_probed("cuda", "bfloat16", 60) is None
    assert kc.ensure_probed("cuda", "bfloat16", 64, backend="math") is None
    assert fake_gpu.calls == [] and warmed == []
    assert kc.ensure_probed("cuda", "bfloat16", 64, backend="sdpa") == "cudnn"
    assert fake_gpu.calls == ["cudnn", "fa2", "fa4"] and warmed == [("cudnn", False), ("cudnn", True)]


def test_an_unwritable_cache_warns_once_and_keeps_the_probe_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(kc, "_MEMO", {})
    monkeypatch.setattr(kc, "_said_unwritable", False)
    measure = FakeMeasure()
    with pytest.warns(UserWarning, match="cannot write the block-kernel cache"):
        kc.probe_entry(facts(), ("fa2",), measure, path=blocker / "sub" / "block_kernels.json")
    assert kc.probe_entry(facts(), ("fa2",), measure, path=blocker / "sub" / "block_kernels.json")["kernels"]["fa2"]
    assert measure.calls == ["fa2"]
