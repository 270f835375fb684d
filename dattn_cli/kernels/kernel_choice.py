"""Which fused kernel a block runs on where there is a choice, chosen by a measured probe cached on disk.

The choice is open on CUDA for fp16/bf16 blocks without a key mask (block_kernels.half_without_mask); each
backend then chooses among its family:

    sdpa  -> cudnn, fa2                       (PyTorch's kernels)
    flash -> fa4, flash-attn2                 (the flash packages installed)
    auto  -> cudnn, fa2, fa4, flash-attn2     (the fastest of all)

Elsewhere one kernel applies: cpu-flash on CPU, efficient on CUDA (fp32, or a key mask), math for math.

The probe times every available kernel, forward and backward, on one representative block per
(GPU, torch, cuDNN, flash packages, dtype, head dim), checks each against the math backend, and keeps the
timings in `block_kernels.json` under the cache directory ($DATTN_CACHE_DIR, else $XDG_CACHE_HOME/dattn, else
~/.cache/dattn); a corrupt file is re-probed and rewritten. One process probes at a time (a lock file), the rest
read its result, so every worker of a sweep runs the same kernel. bench probes before a point's first call
(bench/point.py), never inside its timed calls; a library call probes on its first CUDA half-precision call.
Each kernel's first call, minus a steady call, is kept as its compile time (FA4 compiles its kernels then).

DATTN_BLOCK_KERNEL=cudnn|fa2|fa4|flash-attn2|efficient|math forces that kernel wherever the choice is open,
whatever the backend (to measure each in turn); auto or unset: the probe.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import importlib.metadata
import json
import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from .block_kernels import KERNELS, BlockCall
from .flash_kernels import flash_installs

log = logging.getLogger(__name__)

FAMILIES = {
    "sdpa": ("cudnn", "fa2"),
    "flash": ("fa4", "flash-attn2"),
    "auto": ("cudnn", "fa2", "fa4", "flash-attn2"),
}
FORCIBLE = ("cudnn", "fa2", "fa4", "flash-attn2", "efficient", "math")
PACKAGE_KERNELS = ("fa4", "flash-attn2")
CACHE_FORMAT = 1
PROBE_BLOCK = (16, 8, 2048)  # (b, h, m): 16 segments of 2048 rows, 8 heads, a (b, m, h, D) memory layout
CHECK_BLOCK = (2, 4, 320)  # compared with the math backend, causal and not (320 % 128 == 64: pytorch#196678)
PROBE_REPEATS = 10

_MEMO: dict[str, dict] = {}  # probe entries this process has read or measured
_CHOICE: dict[tuple, str] = {}
_said_unwritable = False


def forced_kernel() -> str | None:
    """DATTN_BLOCK_KERNEL, or None for the probe."""
    value = os.environ.get("DATTN_BLOCK_KERNEL", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in FORCIBLE:
        raise ValueError(f"DATTN_BLOCK_KERNEL={value!r} is unknown: use auto or one of {', '.join(FORCIBLE)}")
    return value


def available(name: str) -> bool:
    """Whether kernel `name` can run on this CUDA build (not whether it is fast or correct: the probe says)."""
    if name in ("fa2", "efficient", "math"):
        return True
    if name == "cudnn":
        return hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention") and torch.backends.cudnn.is_available()
    return {"fa4": flash_installs().fa4, "flash-attn2": flash_installs().fa2}.get(name, False)


def cache_path() -> Path:
    root = os.environ.get("DATTN_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = str(Path(xdg) / "dattn") if xdg else str(Path.home() / ".cache" / "dattn")
    return Path(root) / "block_kernels.json"


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """What besides the GPU, dtype and head dim decides the kernels' speed (part of the probe key)."""
    installs = flash_installs()
    return {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "fa4": (_package_version("flash-attn-4") or "installed") if installs.fa4 else None,
        "flash-attn": (_package_version("flash-attn") or "installed") if installs.fa2 else None,
    }


def probe_facts(gpu: str, dtype: torch.dtype, head_dim: int) -> dict:
    """What a probe's result depends on: its key in the cache."""
    return {"gpu": gpu, **versions(), "dtype": str(dtype).removeprefix("torch."), "head_dim": head_dim}


def probe_key(facts: dict) -> str:
    return " | ".join(f"{name} {facts[name]}" for name in sorted(facts))


def read_cache(path: Path) -> dict[str, dict]:
    """The probe entries in `path`; {} when it is missing, unreadable or not a cache of this format."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return {key: entry for key, entry in data["entries"].items() if _valid(entry)}


def _valid(entry) -> bool:
    kernels = entry.get("kernels") if isinstance(entry, dict) else None
    return isinstance(kernels, dict) and all(
        isinstance(k, dict) and (k.get("ms") is None or isinstance(k.get("ms"), (int, float))) for k in kernels.values()
    )


def _write_cache(path: Path, entries: dict[str, dict]) -> None:
    global _said_unwritable
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "entries": entries}, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        if not _said_unwritable:
            _said_unwritable = True
            warnings.warn(
                f"dattn: cannot write the block-kernel cache {path} ({exc}); set DATTN_CACHE_DIR", stacklevel=2
            )


@contextlib.contextmanager
def _locked(path: Path):
    """One prober at a time across processes (the others then read its entry); unlocked where no lock file can
    be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_name(path.name + ".lock"), "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def probe_entry(facts: dict, candidates: tuple[str, ...], measure: Callable[[str], dict], path: Path | None = None):
    """The probe entry of `facts` (probe_facts): from this process's memo, else the disk cache, else measured now
    (`measure(kernel)` -> {"ms": steady fwd+bwd ms or None, "compile_s": ..., "error": ...} per candidate) and
    written to the cache."""
    key = probe_key(facts)

    def complete(entry) -> bool:
        return entry is not None and all(c in entry["kernels"] for c in candidates)

    if complete(entry := _MEMO.get(key)):
        return entry
    path = cache_path() if path is None else path
    if not complete(entry := read_cache(path).get(key)):
        with _locked(path):
            entries = read_cache(path)
            if not complete(entry := entries.get(key)):
                log.info("dattn: probing block kernels %s for %s", ", ".join(candidates), key)
                entry = {
                    "facts": facts,
                    "kernels": {name: measure(name) for name in candidates},
                    "probed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "block": list(PROBE_BLOCK),
                }
                if not _import_failed(entry):  # a broken install may be mended: probe again next process
                    entries[key] = entry
                    _write_cache(path, entries)
    _MEMO[key] = entry
    return entry


def _import_failed(entry: dict) -> bool:
    """A kernel of the entry failed on its import (FA4 found but not importable: on the H100 run, `cutlass`
    missing from sys.path), not on its blocks."""
    errors = [k.get("error") or "" for k in entry["kernels"].values()]
    return any(e.startswith(("ModuleNotFoundError", "ImportError")) for e in errors)


def fastest(entry: dict, candidates: tuple[str, ...]) -> str | None:
    """The fastest candidate the probe found correct; None when none was."""
    timed = [(entry["kernels"][c]["ms"], c) for c in candidates if entry["kernels"].get(c, {}).get("ms") is not None]
    return min(timed)[1] if timed else None


def choose_kernel(family: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """The kernel of `family` (sdpa, flash or auto) for CUDA half-precision blocks without a mask (memoised per
    process: blocks ask for every call)."""
    forced = forced_kernel()
    device = torch.device(device)
    memo = (family, device.index, dtype, head_dim, forced)
    if memo in _CHOICE:
        return _CHOICE[memo]
    if forced is not None:
        if not available(forced):
            raise ValueError(f"DATTN_BLOCK_KERNEL={forced} is not available here: install it or unset the variable")
        chosen = forced
    else:
        chosen = _measured_choice(family, device, dtype, head_dim)
    _CHOICE[memo] = chosen
    return chosen


def _measured_choice(family: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    candidates = tuple(k for k in FAMILIES[family] if available(k))
    if not candidates:
        raise ValueError(f"backend={family!r} has no kernel here: install flash-attn-4 or flash-attn, or use 'sdpa'")
    if len(candidates) == 1:
        return candidates[0]
    everything = tuple(k for k in FAMILIES["auto"] if available(k))
    facts = probe_facts(torch.cuda.get_device_name(device), dtype, head_dim)
    entry = probe_entry(facts, everything, lambda name: measure_kernel(name, device, dtype, head_dim))
    return fastest(entry, candidates) or ("fa2" if "fa2" in candidates else candidates[0])


def ensure_probed(device: str, dtype: str | torch.dtype, head_dim: int, backend: str = "auto") -> str | None:
    """Before a measurement, outside any timed call: probe where a CUDA call of this dtype and head dim will choose
    a kernel, then run `backend`'s kernel once on a small block, causal and not, so that this process has built
    what it builds on first use (FA4 compiles, cuDNN builds graphs). Returns that kernel; None: no choice here."""
    device = torch.device(device)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or head_dim % 8 or head_dim > 256:
        return None
    if backend not in FAMILIES:
        return None
    kernel = choose_kernel(backend, device, dtype, head_dim)
    with contextlib.suppress(Exception):  # a kernel that cannot run says so in the call itself
        for causal in (False, True):
            _run_kernel(kernel, *_block_inputs(CHECK_BLOCK, device, dtype, head_dim), causal)
    torch.cuda.empty_cache()  # the probe's blocks are not the point's memory
    return kernel


def measure_kernel(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> dict:
    """One kernel on the probe block: its first call (compile time included), a check against the math backend
    (causal and not, forward and gradients), and the median of PROBE_REPEATS steady calls (fwd + bwd)."""
    try:
        run = _block_step(name, PROBE_BLOCK, device, dtype, head_dim, causal=False)
        start = time.perf_counter()
        run()
        torch.cuda.synchronize(device)
        first = time.perf_counter() - start
        for causal in (False, True):
            if error := _mismatch(name, device, dtype, head_dim, causal):
                return {"ms": None, "compile_s": None, "error": error}
        run()
        times = []
        for _ in range(PROBE_REPEATS):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            run()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        ms = statistics.median(times)
        return {"ms": ms, "compile_s": round(max(0.0, first - ms / 1e3), 3), "error": None}
    except Exception as exc:  # a kernel that cannot run here is recorded as such, never chosen
        if isinstance(exc, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
        return {"ms": None, "compile_s": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _block_inputs(block, device, dtype, head_dim, seed=0):
    b, h, m = block
    gen = torch.Generator(device=device).manual_seed(seed)
    return [
        torch.randn(b, m, h, head_dim, generator=gen, device=device, dtype=torch.float32).to(dtype).transpose(1, 2)
        for _ in range(4)
    ]


def _run_kernel(name, q, k, v, dout, causal):
    kernel = KERNELS[name]
    call = BlockCall(causal=causal, scale=q.shape[-1] ** -0.5)
    out, lse = kernel.forward(q, k, v, None, call)
    return (out, lse, *kernel.backward(dout, q, k, v, out, lse, None, call))


def _block_step(name, block, device, dtype, head_dim, causal):
    q, k, v, dout = _block_inputs(block, device, dtype, head_dim)
    return lambda: _run_kernel(name, q, k, v, dout, causal)


def _mismatch(name, device, dtype, head_dim, causal) -> str | None:
    """Why `name` disagrees with the math backend on the check block; None when it agrees (within 16 ulps of
    dtype, relative to each result's largest value)."""
    inputs = _block_inputs(CHECK_BLOCK, device, dtype, head_dim, seed=1)
    got = _run_kernel(name, *inputs, causal)
    want = _run_kernel("math", *inputs, causal)
    tolerance = 16 * torch.finfo(dtype).eps
    for label, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        a, b = a.float().reshape(b.shape), b.float()
        error = (a - b).abs().max().item()
        if not error <= tolerance * max(1.0, b.abs().max().item()):
            return f"{label} differs from the math backend by {error:.3g} (causal={causal})"
    return None


def cached_choices(path: Path | None = None) -> list[dict]:
    """The probes on disk for this torch, cuDNN and flash packages (any GPU): per GPU, dtype and head dim, the kernel
    each backend takes, every kernel's steady ms and compile seconds (None: not run or wrong, see errors)."""
    here = versions()
    found = []
    for entry in read_cache(cache_path() if path is None else path).values():
        facts = entry.get("facts")
        if not isinstance(facts, dict) or any(facts.get(name) != value for name, value in here.items()):
            continue
        kernels = entry["kernels"]
        choice = {family: fastest(entry, tuple(k for k in names if k in kernels)) for family, names in FAMILIES.items()}
        found.append(
            {
                "gpu": facts.get("gpu"),
                "dtype": facts.get("dtype"),
                "head_dim": facts.get("head_dim"),
                **choice,
                "timings_ms": {name: k.get("ms") for name, k in kernels.items()},
                "compile_s": {name: k.get("compile_s") for name, k in kernels.items()},
                "errors": {name: k["error"] for name, k in kernels.items() if k.get("error")},
                "probed_at": entry.get("probed_at"),
            }
        )
    return found


def expected_kernels(cuda: bool) -> dict[str, str]:
    """What each backend's blocks run on here without a key mask, for `dattn impls` (on CUDA: fp16/bf16; the
    choice when probed, else the candidates)."""
    if not cuda:
        return {"math": "math", "sdpa": "cpu-flash"}
    forced = forced_kernel()
    kernels = {"math": "math"}
    for family in ("sdpa", "flash"):
        names = tuple(k for k in FAMILIES[family] if available(k))
        if names:
            probed = {c[family] for c in cached_choices()} - {None}
            kernels[family] = forced or (
                names[0] if len(names) == 1 else "|".join(sorted(probed)) if probed else "probe: " + "|".join(names)
            )
    return kernels
