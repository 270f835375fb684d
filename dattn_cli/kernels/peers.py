"""Peers: other ways to compute dilated attention, measured beside dattn's own as `dattn bench` rows.

* FlexDilatedAttention   torch's FlexAttention with the pattern of docs/semantics.md: a score_mod adds log c(t, u),
                         the number of pairs under which t attends u, so it computes dattn's function exactly; with
                         `counted=False` a boolean mask_mod (c > 0) instead: each key counted once, another function
* FkodomDilatedAttention fkodom's dilated-attention-pytorch 0.2.0 (PyPI), on xformers: the head_groups pattern
* SeedDilatedAttention   the seed project's DilatedAttention (DarcStar-Solutions-Tech/dilated-attention-pytorch,
                         not on PyPI): the head_groups pattern

The two external ones are imported only when built; what keeps them from running here (a missing package, an
import that fails on this torch, the other project installed under the same import name) is their registry
entry's `unavailable`, so a sweep says "cannot run" and why instead of measuring.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from .heads import expand_kv

FLEX_BLOCK = 128
MAX_MASK_BLOCKS = 8192  # torch builds (blocks x blocks) tables for a BlockMask: larger blocks beyond this


def mask_block_size(seq_len: int) -> int:
    """FLEX_BLOCK, doubled until N needs at most MAX_MASK_BLOCKS blocks (at 8M tokens: 1024)."""
    block = FLEX_BLOCK
    while -(-seq_len // block) > MAX_MASK_BLOCKS:
        block *= 2
    return block


def _group_ranges(heads: int, pairs: int) -> list[tuple[int, int]]:
    """head_groups: pair i's heads [lo, hi): H // m each, the first H mod m groups one larger (docs/semantics.md)."""
    sizes = [heads // pairs + (1 if i < heads % pairs else 0) for i in range(pairs)]
    starts = [sum(sizes[:i]) for i in range(pairs)]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def pair_multiplicity(seq_len: int, heads: int, segments: Sequence[int], rates: Sequence[int], semantics: str):
    """c(h, t, u): how many pairs let query t attend key u at head h (0: it does not), written with tensor
    arithmetic only, so FlexAttention can trace it inside its kernels. Independent of kernels/pattern.py."""
    pairs = [(min(w, seq_len), r) for w, r in zip(segments, rates)]
    groups = _group_ranges(heads, len(pairs)) if semantics == "head_groups" else None

    def count(h, t, u):
        c = torch.zeros_like(t)
        for i, (w, r) in enumerate(pairs):
            offset = h % r if groups is None else i % r
            seg_t, seg_u = t // w, u // w
            kept = (seg_t == seg_u) & ((t - seg_t * w) % r == offset) & ((u - seg_u * w) % r == offset)
            if groups is not None:
                kept = kept & (h >= groups[i][0]) & (h < groups[i][1])
            c = c + kept.to(t.dtype)
        return c

    return count


def dilated_block_mask(seq_len: int, segments: Sequence[int], causal: bool, mask_mod, device):
    """A BlockMask visiting, for each query block, only the key blocks its segments can reach: for every pair,
    the segments covering the query block's rows span one interval of key blocks that contains the query block,
    so their union is the interval [min lo, max hi). mask_mod decides inside the visited blocks."""
    from torch.nn.attention.flex_attention import BlockMask

    block = mask_block_size(seq_len)
    blocks = -(-seq_len // block)
    first = torch.arange(blocks, dtype=torch.int64) * block
    last = torch.clamp(first + block, max=seq_len) - 1
    lo = torch.full((blocks,), blocks, dtype=torch.int64)
    hi = torch.zeros(blocks, dtype=torch.int64)
    for w in segments:
        w = min(w, seq_len)
        lo = torch.minimum(lo, (first // w) * w // block)
        hi = torch.maximum(hi, -(-torch.clamp((last // w + 1) * w, max=seq_len) // block))
    if causal:
        hi = torch.minimum(hi, torch.arange(blocks) + 1)
    count = hi - lo  # torch wants a full row of indices per query block: those past `count` are ignored
    indices = (lo[:, None] + torch.arange(blocks)) % blocks
    return BlockMask.from_kv_blocks(
        count.to(torch.int32)[None, None].to(device),
        indices.to(torch.int32)[None, None].to(device),
        BLOCK_SIZE=block,
        mask_mod=mask_mod,
        seq_lengths=(seq_len, seq_len),
    )


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


class FlexDilatedAttention(nn.Module):
    """The dilated pattern on FlexAttention (compiled on CUDA, eager elsewhere: the dense math, for checks).
    counted=True: score + log c(t, u), exactly docs/semantics.md; counted=False: mask c > 0 only."""

    counted = True

    def __init__(
        self,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        semantics: str = "longnet",
        scale: float | None = None,
        compiled: bool | None = None,
        **_: object,
    ):
        super().__init__()
        self.segment_lengths, self.dilation_rates = list(segment_lengths), list(dilation_rates)
        self.semantics, self.scale, self.compiled = semantics, scale, compiled
        self._masks: dict = {}

    def describe(self) -> str:
        how = "score_mod + log c (dattn's function)" if self.counted else "boolean mask_mod c > 0 (keys counted once)"
        return f"{type(self).__name__}: FlexAttention, {how}"

    def _mods(self, n: int, heads: int, causal: bool):
        count = pair_multiplicity(n, heads, self.segment_lengths, self.dilation_rates, self.semantics)

        def mask_mod(b, h, q_idx, kv_idx):
            ok = (count(h, q_idx, kv_idx) > 0) & (q_idx < n) & (kv_idx < n)
            return ok & (kv_idx <= q_idx) if causal else ok

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + torch.log(count(h, q_idx, kv_idx).to(score.dtype))

        return mask_mod, (score_mod if self.counted else None)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        n, heads = q.shape[1], q.shape[2]
        k, v = expand_kv(k, v, heads)
        key = (n, heads, is_causal, q.device)
        if key not in self._masks:
            mask_mod, score_mod = self._mods(n, heads, is_causal)
            self._masks = {key: (dilated_block_mask(n, self.segment_lengths, is_causal, mask_mod, q.device), score_mod)}
        block_mask, score_mod = self._masks[key]
        compiled = q.device.type == "cuda" if self.compiled is None else self.compiled
        fn = _compiled_flex() if compiled else flex_attention
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # eager on purpose off CUDA: torch advises compiling
            out = fn(t(q), t(k), t(v), score_mod=score_mod, block_mask=block_mask, scale=self.scale)
        return t(out)


class FlexDilatedMaskAttention(FlexDilatedAttention):
    counted = False


def _head_groups_only(who: str, semantics: str) -> None:
    if semantics != "head_groups":
        raise ValueError(f"{who} computes the head_groups pattern only: run it with --semantics head_groups")


def _whole_segments(who: str, n: int, segments: Sequence[int]) -> None:
    if any(n % w for w in segments):
        raise ValueError(f"{who} needs N divisible by every segment length: N={n} with segments {list(segments)}")


class FkodomDilatedAttention(nn.Module):
    """fkodom's DilatedAttention (dilated-attention-pytorch 0.2.0), constructed with its defaults."""

    who = "fkodom's dilated-attention-pytorch"

    def __init__(self, segment_lengths: Sequence[int], dilation_rates: Sequence[int], semantics: str = "longnet", **_):
        super().__init__()
        _head_groups_only(self.who, semantics)
        from dilated_attention_pytorch.dilated_attention import DilatedAttention

        self.segment_lengths = list(segment_lengths)
        self.inner = DilatedAttention(list(segment_lengths), list(dilation_rates))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        _whole_segments("fkodom's dilated-attention-pytorch", q.shape[1], self.segment_lengths)
        k, v = expand_kv(k, v, q.shape[2])
        return self.inner(q, k, v, is_causal=is_causal)


class SeedDilatedAttention(FkodomDilatedAttention):
    """The seed project's DilatedAttention, constructed with its defaults."""

    who = "the seed project's DilatedAttention"


# --- why an external peer cannot run here (ImplSpec.probe) ------------------------------------------
FKODOM = "fkodom"
SEED = "seed"


def installed_project() -> str | None:
    """Which project owns the installed `dilated_attention_pytorch` (both import under that name): the seed
    project's has a core/ package, fkodom's 0.2.0 does not; None when neither is installed."""
    spec = importlib.util.find_spec("dilated_attention_pytorch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return SEED if any((Path(p) / "core").is_dir() for p in spec.submodule_search_locations) else FKODOM


@functools.cache
def import_problem(project: str) -> str | None:
    """Why `project`'s DilatedAttention cannot be imported here, or None."""
    found = installed_project()
    if found is not None and found != project:
        other = {FKODOM: "fkodom's dilated-attention-pytorch 0.2.0", SEED: "the seed project's"}[found]
        return f"the installed dilated_attention_pytorch is {other}: both import under that one name"
    try:
        import dilated_attention_pytorch.dilated_attention  # noqa: F401
    except Exception as exc:  # an old xformers or torchscale built for another torch fails in many ways
        return f"dilated_attention_pytorch does not import on torch {torch.__version__}: {type(exc).__name__}: " + (
            str(exc).splitlines()[0][:200] if str(exc) else "(no message)"
        )
    return None
