"""Block-sparse attention patterns as block tables: (num_blocks, num_blocks) bool, True = the query
block (row) attends the key block (column).

Each pattern is a small function of the block grid; they compose with `|` (as attention-gym composes
mask functions). Causality is not part of a table: it is applied at call time (key blocks after the
query block are dropped, the diagonal block is attended causally), so one table serves both.

* local        |i - j| <= window
* dilated      per (segment, dilation) pair: i, j in the same segment of ŵ/block_size blocks and
               (i - j) % r == 0, ŵ = min(w, N); the union over pairs
* global_local the first `global_blocks` blocks see and are seen by all, plus a local window
* hierarchical a local window, plus for level l = 1..levels every 2^l-th block out to distance
               window · 2^(l+1) (coarser and longer with each level)
* sliding_window  token level: query t attends keys t - window_left .. t + window_right (default one block
               each side); its table is the band's block cover, and it runs on the banded executor (window.py),
               exact per token, O(N x window)
* longnet      the exact block cover of the dilated pattern of docs/semantics.md: a block pair is active when
               some head and pair keep a row in both blocks within one segment (an upper bound of
               what dilated attention computes, on whole blocks)

Density = active blocks / all blocks of the full N x N grid (causal calls use about half of them);
`attended_pairs` gives the exact element count, causal and ragged last block included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..pattern import validate_pattern
from ..reference import pair_offsets

PATTERNS = ("local", "dilated", "global_local", "hierarchical", "longnet", "sliding_window")
TABLE_PATTERNS = PATTERNS[:-1]  # computed on whole blocks of their table; sliding_window is token-exact (window.py)
USES_SEGMENTS = ("dilated", "longnet")
USES_WINDOW = ("local", "global_local", "hierarchical")
MAX_TABLE_BLOCKS = 1 << 16  # blocks per side of a (dense, bool) block table: 4 GiB at most


def _distance(num_blocks: int) -> torch.Tensor:
    i = torch.arange(num_blocks)
    return i[:, None] - i[None, :]


def local_blocks(num_blocks: int, window: int) -> torch.Tensor:
    return _distance(num_blocks).abs() <= window


def global_blocks(num_blocks: int, count: int) -> torch.Tensor:
    g = torch.arange(num_blocks) < count
    return g[:, None] | g[None, :]


def dilated_blocks(num_blocks: int, segment_blocks: int, rate: int) -> torch.Tensor:
    seg = torch.arange(num_blocks) // segment_blocks
    return (seg[:, None] == seg[None, :]) & (_distance(num_blocks) % rate == 0)


def band_blocks(num_blocks: int, block_size: int, left: int, right: int) -> torch.Tensor:
    """Block pairs (I, J) holding some t in I and u in J with t - left <= u <= t + right."""
    d = _distance(num_blocks)  # I - J
    return (d * block_size <= block_size - 1 + left) & (-d * block_size <= block_size - 1 + right)


def hierarchical_blocks(num_blocks: int, window: int, levels: int) -> torch.Tensor:
    d = _distance(num_blocks)
    table = d.abs() <= window
    for level in range(1, levels + 1):
        stride = 2**level
        table |= (d % stride == 0) & (d.abs() <= window * 2 * stride)
    return table


def longnet_cover(
    seq_len: int,
    block_size: int,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    num_heads: int,
    semantics: str,
) -> torch.Tensor:
    """Block pairs (I, J) holding some (query, key) pair of the dilated pattern, any head."""
    num_blocks = -(-seq_len // block_size)
    table = torch.zeros(num_blocks, num_blocks, dtype=torch.bool)
    positions = torch.arange(seq_len)
    used = {
        (w, r, o)
        for h in range(num_heads)
        for w, r, o in pair_offsets(h, num_heads, segment_lengths, dilation_rates, semantics)
    }
    for w, r, offset in sorted(used):
        w_hat = min(w, seq_len)
        kept = positions[(positions % w_hat) % r == offset]
        # blocks holding kept rows, per segment: all of them attend each other
        segment, block = kept // w_hat, kept // block_size
        pairs = torch.unique(segment * num_blocks + block)
        seg_of, blk_of = pairs // num_blocks, pairs % num_blocks
        for s in torch.unique(seg_of).tolist():
            blocks = blk_of[seg_of == s]
            table[blocks[:, None], blocks[None, :]] = True
    return table


def block_sparse_options(
    pattern: str,
    segment_lengths: Sequence[int] = (),
    dilation_rates: Sequence[int] = (),
    semantics: str = "longnet",
    **params,
) -> dict:
    """Constructor keywords of a block-sparse module for `pattern`, from a caller's general settings:
    segments and dilations only for the patterns that use them, semantics only for 'longnet', and
    global_blocks / levels only for the patterns they shape. window and density pass through, so a
    pattern that takes neither refuses them (the module never ignores an argument it was given)."""
    options = {"pattern": pattern, **params}
    if pattern != "global_local":
        options.pop("global_blocks", None)
    if pattern != "hierarchical":
        options.pop("levels", None)
    if pattern in USES_SEGMENTS:
        options.update(segment_lengths=list(segment_lengths), dilation_rates=list(dilation_rates))
    if pattern == "longnet":
        options["semantics"] = semantics
    if pattern != "sliding_window" and options.get("window_left") is None and options.get("window_right") is None:
        options.pop("window_left", None)  # the module's default; given ones still reach (and are refused by) it
        options.pop("window_right", None)
    return options


def attended_pairs(table: torch.Tensor, seq_len: int, block_size: int, causal: bool) -> int:
    """(query, key) pairs the table attends for one (batch, head): whole blocks, the ragged last block
    and (causal) the diagonal blocks' lower triangles counted exactly."""
    num_blocks = table.shape[0]
    sizes = torch.full((num_blocks,), block_size, dtype=torch.int64)
    sizes[-1] = seq_len - block_size * (num_blocks - 1)
    full = table & (_distance(num_blocks) > 0) if causal else table
    count = int((sizes[:, None] * sizes[None, :])[full].sum())
    if causal:
        diag = table.diagonal()
        count += int((sizes * (sizes + 1) // 2)[diag].sum())
    return count


@dataclass(frozen=True)
class BlockPattern:
    """A named block pattern with its parameters; `table(N, H)` gives the block table."""

    name: str = "local"
    block_size: int = 128
    window: int | None = None
    global_blocks: int = 1
    levels: int = 2
    density: float | None = None
    segment_lengths: tuple[int, ...] = field(default=())
    dilation_rates: tuple[int, ...] = field(default=())
    semantics: str = "longnet"
    window_left: int | None = None  # sliding_window: tokens before (and after) each query; default block_size
    window_right: int | None = None

    def __post_init__(self):
        if self.name not in PATTERNS:
            raise ValueError(f"pattern={self.name!r} is unknown: use one of {', '.join(PATTERNS)}")
        for name in ("block_size", "global_blocks", "levels"):
            value = getattr(self, name)
            low = 1 if name == "block_size" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0
        ):
            raise ValueError(
                f"window must be an integer >= 0 (blocks on each side of the diagonal), got {self.window!r}"
            )
        if self.window is not None and self.name not in USES_WINDOW:
            raise ValueError(f"pattern={self.name!r} takes no window; pass window with one of {', '.join(USES_WINDOW)}")
        if self.density is not None:
            if not isinstance(self.density, (int, float)) or not 0 < self.density <= 1:
                raise ValueError(f"density must be in (0, 1], got {self.density!r}")
            if self.name not in USES_WINDOW:
                raise ValueError(
                    f"pattern={self.name!r} takes no density: its density follows from segment_lengths and "
                    f"dilation_rates; pass density with one of {', '.join(USES_WINDOW)}"
                )
            if self.window is not None:
                raise ValueError("pass window or density, not both: density picks the window")
        self._check_token_window()
        if self.name in USES_SEGMENTS:
            segs, rates = validate_pattern(self.segment_lengths, self.dilation_rates, self.semantics)
            object.__setattr__(self, "segment_lengths", segs)
            object.__setattr__(self, "dilation_rates", rates)
        elif self.segment_lengths or self.dilation_rates:
            raise ValueError(
                f"pattern={self.name!r} does not use segment_lengths/dilation_rates: leave them out, "
                "or use pattern='dilated' or 'longnet'"
            )

    def _check_token_window(self) -> None:
        for name in ("window_left", "window_right"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.name != "sliding_window":
                raise ValueError(
                    f"{name} is a token window of pattern='sliding_window'; pattern={self.name!r} takes "
                    "window (blocks) instead"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (tokens), got {value!r}")

    @property
    def token_window(self) -> tuple[int, int]:
        """(left, right) tokens of the sliding_window pattern."""
        left = self.block_size if self.window_left is None else self.window_left
        return left, self.block_size if self.window_right is None else self.window_right

    def num_blocks(self, seq_len: int) -> int:
        return -(-seq_len // self.block_size)

    def _window_table(self, num_blocks: int, window: int) -> torch.Tensor:
        if self.name == "local":
            return local_blocks(num_blocks, window)
        if self.name == "global_local":
            return local_blocks(num_blocks, window) | global_blocks(num_blocks, self.global_blocks)
        return hierarchical_blocks(num_blocks, window, self.levels)

    def resolved_window(self, num_blocks: int) -> int:
        """The window in blocks: given, or the one whose block density is closest to `density`
        (density grows with the window, so a bisection finds it)."""
        if self.window is not None:
            return self.window
        if self.density is None:
            return 1
        lo, hi = 0, num_blocks
        while lo < hi:
            mid = (lo + hi) // 2
            if self._window_table(num_blocks, mid).float().mean().item() < self.density:
                lo = mid + 1
            else:
                hi = mid
        candidates = {max(0, lo - 1), lo}
        return min(
            candidates, key=lambda w: abs(self._window_table(num_blocks, w).float().mean().item() - self.density)
        )

    def table(self, seq_len: int, num_heads: int) -> torch.Tensor:
        """(num_blocks, num_blocks) bool on the CPU; ValueError past MAX_TABLE_BLOCKS blocks per side."""
        nb = self.num_blocks(seq_len)
        if nb > MAX_TABLE_BLOCKS:
            raise ValueError(
                f"N={seq_len:,} in blocks of {self.block_size} is {nb:,} blocks per side: the block table "
                f"holds at most {MAX_TABLE_BLOCKS:,}; use a larger --block-size or a shorter --seq-len"
            )
        if self.name in USES_WINDOW:
            return self._window_table(nb, self.resolved_window(nb))
        if self.name == "sliding_window":
            return band_blocks(nb, self.block_size, *self.token_window)
        if self.name == "dilated":
            table = torch.zeros(nb, nb, dtype=torch.bool)
            for w, r in zip(self.segment_lengths, self.dilation_rates):
                table |= dilated_blocks(nb, -(-min(w, seq_len) // self.block_size), r)
            return table
        return longnet_cover(
            seq_len, self.block_size, self.segment_lengths, self.dilation_rates, num_heads, self.semantics
        )

    def pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        """(query, key) pairs one (batch, head) attends: exact per token for sliding_window, by the table else."""
        if self.name == "sliding_window":
            from .window import window_pairs

            return window_pairs(seq_len, *self.token_window, causal)
        return attended_pairs(self.table(seq_len, num_heads), seq_len, self.block_size, causal)

    def label(self) -> str:
        """A compact name for tables and report rows, e.g. local(d=0.1,b=128); segments are reported
        in their own columns."""
        params = []
        if self.name == "sliding_window":
            params += [f"l={self.token_window[0]}", f"r={self.token_window[1]}"]
        if self.name in USES_WINDOW:
            params.append(
                f"d={self.density:g}"
                if self.density is not None
                else f"w={self.window if self.window is not None else 1}"
            )
            if self.name == "global_local":
                params.append(f"g={self.global_blocks}")
            if self.name == "hierarchical":
                params.append(f"l={self.levels}")
        params.append(f"b={self.block_size}")
        return f"{self.name}({','.join(params)})"

    def describe(self, seq_len: int | None = None) -> str:
        if self.name == "sliding_window":
            return f"sliding_window({self.token_window[0]} tokens before, {self.token_window[1]} after; table in blocks of {self.block_size})"
        if self.name in USES_SEGMENTS:
            params = f"segments {list(self.segment_lengths)}, dilations {list(self.dilation_rates)}"
            if self.name == "longnet":
                params += f", semantics {self.semantics}"
        else:
            if self.window is None and self.density is not None:
                window = f"window for density {self.density:g}"
                if seq_len is not None:
                    window += f" = {self.resolved_window(self.num_blocks(seq_len))}"
            else:
                window = f"window {self.window if self.window is not None else 1}"
            params = window + (f", {self.global_blocks} global" if self.name == "global_local" else "")
            params += f", {self.levels} levels" if self.name == "hierarchical" else ""
        return f"{self.name}({params}, block {self.block_size})"
