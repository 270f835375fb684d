"""The one registry of implementations and baselines, and the factories that read it.

Every command (verify, bench, profile, plan, impls) learns what an implementation is from its ImplSpec
and from nothing else: how it splits work over ranks (strategy), where it runs, how to shard a problem
for it, which pairs it computes (the FLOP hook), which memory model the planner uses for it, and how
to construct it. Adding an implementation = its module + one `register(ImplSpec(...))` call: in entries.py for
dattn's own (the package imports it with this module, so the registry is complete whenever it is imported), or in
your module named in DATTN_PLUGINS (or a package's `dattn.implementations` entry point), which every
dattn process, its measurement workers and ranks included, imports with this registry.

The hooks take the problem duck-typed (workload.Problem: batch, seq_len, heads, segment_lengths, ...)
so that this module depends on kernels only.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from .distributed.hybrid import check_sizes, head_parallel_size
from .distributed.sharding import padded_length
from .pattern import attended_pairs, build_blocks

# "peer": another project's dilated attention (or FlexAttention with the pattern), measured beside dattn's
Strategy = Literal[
    "single", "ring", "allgather", "head_parallel", "hybrid", "block_sparse", "dense", "reference", "peer"
]
# Which of plan/memory.py's models counts its bytes: kept rows as strided views with pooled gathers
# ("strided"), gathered by index one block at a time ("index_gather"), a fused dense kernel ("dense"),
# N x N scores ("dense_scores"), the float64 reference ("reference"); None: the planner has no model.
MemoryModel = Literal["strided", "index_gather", "dense", "dense_scores", "reference"]
DILATED_BACKENDS = ("math", "sdpa", "flash")


# --- counting hooks: the (query, key) pairs an implementation computes, P of the FLOP convention -----
def dense_pairs(w: Any) -> int:
    n = w.seq_len
    return w.batch * w.heads * (n * (n + 1) // 2 if w.causal else n * n)


def dilated_pairs(w: Any) -> int:
    blocks = build_blocks(w.seq_len, w.heads, w.segment_lengths, w.dilation_rates, w.semantics)
    return attended_pairs(w.batch, blocks, w.causal)


def block_sparse_pairs(w: Any) -> int:
    return w.block_pattern().pairs(w.seq_len, w.heads, w.causal) * w.batch * w.heads


# --- shards: how many positions each of `world` ranks holds, and why a problem cannot be split -------
def shard_length(w: Any, world: int) -> int:
    """L, the positions each of `world` ranks holds for w's implementation: ceil(N/p), or more where its
    shards must align with the segments (ring, all-gather) or with blocks (block-sparse); the sequence is
    padded at the end to world·L and the padding masked (distributed/sharding.py)."""
    spec = REGISTRY[w.impl]
    layout = getattr(w, "layout", "contiguous")
    if spec.block_sparse:
        return padded_length(w.seq_len, world, block_size=w.block_size, layout=layout) // world
    if spec.strategy in ("ring", "allgather"):
        return padded_length(w.seq_len, world, w.segment_lengths, layout=layout) // world
    if spec.strategy == "hybrid":  # the ring over world/h blocks aligned with the segments, its shards with h
        h = hybrid_size(w, world)
        if h < world:
            return padded_length(w.seq_len, world // h, w.segment_lengths, h, layout) // world
    return padded_length(w.seq_len, world, layout=layout) // world


def hybrid_size(w: Any, world: int) -> int:
    """h of a hybrid problem: its head_parallel_size, else the default (distributed/hybrid.py)."""
    return head_parallel_size(w.heads, world, getattr(w, "head_parallel_size", None))


def shard_call_options(w: Any, key_padding_mask: Any, padded_len: int | None = None) -> dict[str, Any]:
    """Keywords of a module call on a shard of shard_length: the key padding mask (the padding's, with the
    caller's own), and for block-sparse modules the length before padding (their block table is its). With
    packed documents: their cu_seqlens over the padded length (the padding one more, masked, document)."""
    options = {"key_padding_mask": key_padding_mask}
    if w.documents is not None:
        from .documents import offsets

        padding = [] if padded_len is None or padded_len == w.seq_len else [padded_len - w.seq_len]
        options["cu_seqlens"] = offsets([*w.documents, *padding])
    elif REGISTRY[w.impl].block_sparse and key_padding_mask is not None:
        options["seq_len"] = w.seq_len
    return options


# Shard rules: why a problem cannot be split over `world` contiguous shards, or None. Padding (shard_length)
# takes any N over any p; refused are heads that do not split, and padding that would more than
# MAX_PADDING-fold the sequence (segments with a large lcm and no divisor near N/p: mostly padding computed).
MAX_PADDING = 4


def _padding(w: Any, world: int, what: str) -> str | None:
    padded = shard_length(w, world) * world
    if padded > MAX_PADDING * w.seq_len:
        return (
            f"N={w.seq_len} over {world} ranks pads to {padded} positions to align shards with {what}, "
            f"over {MAX_PADDING}x N: choose N, p or {what} so that N/p is near a multiple or divisor of each"
        )
    return None


def even_shards(w: Any, world: int) -> str | None:
    return None


def segment_aligned_shards(w: Any, world: int) -> str | None:
    return _padding(w, world, "the segment lengths")


def head_shards(w: Any, world: int) -> str | None:
    # heads cannot be padded: head_groups assigns pairs by H, so extra heads would change the real heads' pattern
    if w.heads % world:
        return f"{w.heads} heads are not divisible by {world} ranks"
    return None


def hybrid_shards(w: Any, world: int) -> str | None:
    try:
        check_sizes(world, hybrid_size(w, world), w.heads)
    except ValueError as exc:
        return str(exc)
    return _padding(w, world, "the segment lengths")


def block_aligned_shards(w: Any, world: int) -> str | None:
    return _padding(w, world, "the block size")


@dataclass(frozen=True)
class ImplSpec:
    """What every command needs to know about one implementation or baseline."""

    name: str
    cls: type[nn.Module]  # constructed by workload/build.py: core (segments, rates, ...), multihead (E, H, ...)
    kind: Literal["core", "multihead"]
    strategy: Strategy
    summary: str
    pairs: Callable[[Any], int] = dilated_pairs  # P, the pairs it computes (workload/counts.py)
    memory_model: MemoryModel | None = "strided"
    distributed: bool = False  # runs sharded over a process group of any size
    single_device: bool = True  # runs as a plain module on one process
    shard_rule: Callable[[Any, int], str | None] = even_shards
    block_sparse: bool = False  # takes pattern options (pattern, block_size, window, density, ...)
    baseline: bool = False  # a dense reference point for sweeps, not a dilated implementation
    preferred: bool = False  # what `auto` picks among the candidates of its kind
    devices: tuple[str, ...] = ("cpu", "cuda")
    backends: tuple[str, ...] = DILATED_BACKENDS  # attention backends it can run its blocks on
    requires: tuple[str, ...] = ()  # importable modules it needs
    install_hint: str = ""
    # why it cannot run although its modules are found (e.g. an import that fails on this torch); None: it can
    probe: Callable[[], str | None] | None = None

    def where(self) -> str:
        ranks = (
            "1 process or p ranks"
            if self.distributed and self.single_device
            else ("p ranks" if self.distributed else "1 process")
        )
        return f"{', '.join(self.devices)}; {ranks}"

    def unavailable(self, device: str = "cpu") -> str | None:
        """Why it cannot run on `device` here, with the fix; None when it can."""
        device_type = device.split(":")[0]
        if device_type not in self.devices:
            return f"runs on {' or '.join(self.devices)} only, not {device_type}"
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            return f"needs {', '.join(missing)}: {self.install_hint or 'install it'}"
        if self.probe is not None and (reason := self.probe()):
            return reason
        if device_type == "cuda" and not torch.cuda.is_available():
            return "no CUDA device here"
        return None


REGISTRY: dict[str, ImplSpec] = {}


def register(spec: ImplSpec) -> ImplSpec:
    REGISTRY[spec.name] = spec
    return spec


def get_implementation(name: str) -> ImplSpec:
    if name not in REGISTRY:
        raise ValueError(f"unknown implementation {name!r}: use one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def names(predicate: Callable[[ImplSpec], bool] = lambda spec: True) -> list[str]:
    return [name for name, spec in REGISTRY.items() if predicate(spec)]


def _choose(
    kind: str, wanted: Literal["core", "multihead"], cfg: dict[str, Any]
) -> tuple[ImplSpec, str, dict[str, Any]]:
    """The implementation, why, and its constructor options. `auto` shards one sequence over ranks only
    when a sequence-parallel group is given (process_group=..., e.g. torch.distributed.group.WORLD):
    without one, each rank of a multi-process job has its own batch (data parallel), so single-device."""
    if kind != "auto":
        impl = get_implementation(kind)
        if impl.kind != wanted or impl.baseline:
            raise ValueError(
                f"kind={kind!r} is a {'baseline' if impl.baseline else impl.kind} implementation; pick a "
                f"{wanted} one: " + ", ".join(names(lambda s: s.kind == wanted and not s.baseline))
            )
        return impl, f"chosen: {impl.name} (requested)", cfg
    own_kind = [i for i in REGISTRY.values() if i.kind == wanted and not i.baseline]
    group = cfg.get("process_group")
    if group is not None:
        candidates = [i for i in own_kind if i.distributed]
        if not candidates:
            raise ValueError(
                f"process_group is given but no distributed {wanted} implementation is registered: "
                "leave process_group out for a single-device module"
            )
        why = f"process_group of {_group_size(group)} rank(s) given: sequence parallel"
    else:
        cfg = {key: value for key, value in cfg.items() if key != "process_group"}  # an explicit None
        candidates = [i for i in own_kind if i.single_device]
        world = _group_size(None)
        why = (
            f"world size {world}"
            if world == 1
            else (
                f"world size {world} but no process_group given: data parallel, single-device (pass "
                "process_group= to shard one sequence over its ranks)"
            )
        )
    impl = next((i for i in candidates if i.preferred), candidates[0])
    return impl, f"auto chose {impl.name} ({why}; {impl.summary})", cfg


def _group_size(group: Any) -> int:
    """Ranks in `group` (None: the whole job; 1 without torch.distributed)."""
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not initialised:
        if group is not None:
            raise ValueError(
                "process_group is given but torch.distributed is not initialised: call "
                "torch.distributed.init_process_group first, or leave process_group out"
            )
        return 1
    return torch.distributed.get_world_size(group)


def create_dilated_attention(kind: str = "auto", **cfg: Any) -> nn.Module:
    """Build a core implementation by registry name, or `auto` (see `_choose`, and `module.describe()`)."""
    impl, why, cfg = _choose(kind, "core", cfg)
    module = impl.cls(**cfg)
    module.selection_reason = why
    return module


def create_multihead_dilated_attention(kind: str = "auto", **cfg: Any) -> nn.Module:
    """Build a multihead implementation by registry name, or `auto` (see `_choose`, and `module.describe()`)."""
    impl, why, cfg = _choose(kind, "multihead", cfg)
    module = impl.cls(**cfg)
    module.attention.selection_reason = why
    return module


PLUGIN_VARIABLE = "DATTN_PLUGINS"
ENTRY_POINT_GROUP = "dattn.implementations"


class PluginError(ImportError, ValueError):
    """A plugin that cannot be imported: bad input to dattn (the CLI's one line, exit 2), still an ImportError."""


def load_plugins() -> None:
    """Import the modules that register implementations from outside dattn: DATTN_PLUGINS (module names,
    comma-separated; e.g. DATTN_PLUGINS=my_attention) and installed packages' 'dattn.implementations'
    entry points. Each registers its ImplSpecs on import; one that fails raises PluginError naming it."""
    for name in filter(None, (part.strip() for part in os.environ.get(PLUGIN_VARIABLE, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise PluginError(
                f"{PLUGIN_VARIABLE}: cannot import {name[:200]!r} ({exc}); fix the module name or its PYTHONPATH"
            ) from None
        except Exception as exc:  # the plugin's own code failed: --debug shows where
            raise PluginError(
                f"{PLUGIN_VARIABLE}: importing {name[:200]!r} failed: {type(exc).__name__}: {exc} "
                "(--debug shows the traceback)"
            ) from exc
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry_point.load()
        except Exception as exc:
            raise PluginError(
                f"entry point {entry_point.name!r} ({ENTRY_POINT_GROUP}) failed to load: "
                f"{type(exc).__name__}: {exc}; fix or uninstall the package that provides it"
            ) from exc
