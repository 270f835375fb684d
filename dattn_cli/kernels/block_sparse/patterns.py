"""Block-sparse attention patterns as block tables: (num_blocks, num_blocks) bool, True = the query
block (row) attends the key block (column).

PATTERN_TABLE is the one list of patterns, in the style of attention-gym's mask library: each entry names
the parameters its pattern takes and the function that makes its table from them; label(), describe(), the
checks of the parameters and `block_sparse_options` all follow from it. Adding a pattern is one entry (and,
for a new kind of parameter, one PARAMETERS entry). Table functions compose with `|` (as attention-gym
composes mask functions). Causality is not part of a table: it is applied at call time (key blocks after
the query block are dropped, the diagonal block is attended causally), so one table serves both.

* local        |i - j| <= window
* dilated      per (segment, dilation) pair: i, j in the same segment of ŵ/block_size blocks and
               (i - j) % r == 0, ŵ = min(w, N); the union over pairs
* global_local the first `global_blocks` blocks see and are seen by all, plus a local window
* hierarchical a local window, plus for level l = 1..levels every 2^l-th block out to distance
               window · 2^(l+1) (coarser and longer with each level)
* longnet      the exact block cover of the dilated pattern of docs/semantics.md: a block pair is active when
               some head and pair keep a row in both blocks within one segment (an upper bound of
               what dilated attention computes, on whole blocks)
* sliding_window  token level: query t attends keys t - window_left .. t + window_right (default one block
               each side); its table is the band's block cover, and it runs on the banded executor (window.py),
               exact per token, O(N x window)

Density = active blocks / all blocks of the full N x N grid (causal calls use about half of them);
`attended_pairs` gives the exact element count, causal and ragged last block included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..pattern import validate_pattern
from ..reference import pair_offsets
from .window import window_pairs

MAX_TABLE_BLOCKS = 1 << 16  # blocks per side of a (dense, bool) block table: 4 GiB at most


# table functions of the block grid -------------------------------------------------------------------


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


# the pattern table ---------------------------------------------------------------------------------------


def _window_label(p: BlockPattern) -> str:
    return f"d={p.density:g}" if p.density is not None else f"w={p.window if p.window is not None else 1}"


def _window_describe(p: BlockPattern, seq_len: int | None) -> str:
    if p.window is not None or p.density is None:
        return f"window {p.window if p.window is not None else 1}"
    text = f"window for density {p.density:g}"
    return text if seq_len is None else f"{text} = {p.resolved_window(p.num_blocks(seq_len))}"


@dataclass(frozen=True)
class Parameter:
    """A kind of pattern parameter: the BlockPattern fields it sets, its part of label() (None: shown in
    report columns of its own) and of describe(pattern, seq_len)."""

    fields: tuple[str, ...]
    label: Callable[[BlockPattern], str | None]
    describe: Callable[[BlockPattern, int | None], str]


PARAMETERS = {
    "window": Parameter(("window", "density"), _window_label, _window_describe),
    "global_blocks": Parameter(
        ("global_blocks",), lambda p: f"g={p.global_blocks}", lambda p, _: f"{p.global_blocks} global"
    ),
    "levels": Parameter(("levels",), lambda p: f"l={p.levels}", lambda p, _: f"{p.levels} levels"),
    "segments": Parameter(
        ("segment_lengths", "dilation_rates"),
        lambda p: None,
        lambda p, _: f"segments {list(p.segment_lengths)}, dilations {list(p.dilation_rates)}",
    ),
    "semantics": Parameter(("semantics",), lambda p: None, lambda p, _: f"semantics {p.semantics}"),
    "token_window": Parameter(
        ("window_left", "window_right"),
        lambda p: "l={},r={}".format(*p.token_window),
        lambda p, _: "{} tokens before, {} after".format(*p.token_window),
    ),
}


@dataclass(frozen=True)
class PatternKind:
    """One entry of PATTERN_TABLE.

    params: the PARAMETERS the pattern takes, in the order label() and describe() show them.
    table: the block table, (pattern, seq_len, num_heads) -> (num_blocks, num_blocks) bool; a pattern taking
        "window" gives (pattern, num_blocks, window) -> table instead, and `density` picks its window.
    token_pairs: set for a token-level pattern, (pattern, seq_len, causal) -> the exact (query, key) pairs of
        one (batch, head); its table is only a cover, and it runs on the banded executor (window.py).
    """

    params: tuple[str, ...]
    table: Callable[..., torch.Tensor]
    token_pairs: Callable[[BlockPattern, int, bool], int] | None = None


def _dilated_table(p: BlockPattern, seq_len: int, num_heads: int) -> torch.Tensor:
    nb = p.num_blocks(seq_len)
    table = torch.zeros(nb, nb, dtype=torch.bool)
    for w, r in zip(p.segment_lengths, p.dilation_rates):
        table |= dilated_blocks(nb, -(-min(w, seq_len) // p.block_size), r)
    return table


PATTERN_TABLE: dict[str, PatternKind] = {
    "local": PatternKind(("window",), lambda p, nb, w: local_blocks(nb, w)),
    "dilated": PatternKind(("segments",), _dilated_table),
    "global_local": PatternKind(
        ("window", "global_blocks"), lambda p, nb, w: local_blocks(nb, w) | global_blocks(nb, p.global_blocks)
    ),
    "hierarchical": PatternKind(("window", "levels"), lambda p, nb, w: hierarchical_blocks(nb, w, p.levels)),
    "longnet": PatternKind(
        ("segments", "semantics"),
        lambda p, n, h: longnet_cover(n, p.block_size, p.segment_lengths, p.dilation_rates, h, p.semantics),
    ),
    "sliding_window": PatternKind(
        ("token_window",),
        lambda p, n, h: band_blocks(p.num_blocks(n), p.block_size, *p.token_window),
        token_pairs=lambda p, n, causal: window_pairs(n, *p.token_window, causal),
    ),
}


def takes(pattern: str, param: str) -> bool:
    """Whether `pattern` takes the PARAMETERS entry `param` (False for an unknown pattern)."""
    kind = PATTERN_TABLE.get(pattern)
    return kind is not None and param in kind.params


def patterns_taking(param: str) -> tuple[str, ...]:
    return tuple(name for name in PATTERN_TABLE if takes(name, param))


def _named(patterns: Sequence[str]) -> str:
    """'dilated' or 'longnet', as an error message names them."""
    return " or ".join(repr(name) for name in patterns)


PATTERNS = tuple(PATTERN_TABLE)
TABLE_PATTERNS = tuple(n for n, k in PATTERN_TABLE.items() if k.token_pairs is None)  # computed on whole blocks
USES_SEGMENTS = patterns_taking("segments")
USES_WINDOW = patterns_taking("window")


def block_sparse_options(
    pattern: str,
    segment_lengths: Sequence[int] = (),
    dilation_rates: Sequence[int] = (),
    semantics: str = "longnet",
    **params,
) -> dict:
    """Constructor keywords of a block-sparse module for `pattern`, from a caller's general settings:
    segments and dilations only for the patterns that use them, semantics only for those it shapes, and
    global_blocks / levels only for the patterns they shape. window and density pass through, so a
    pattern that takes neither refuses them (the module never ignores an argument it was given)."""
    options = {"pattern": pattern, **params}
    for param in ("global_blocks", "levels"):
        if not takes(pattern, param):
            options.pop(param, None)
    if takes(pattern, "segments"):
        options.update(segment_lengths=list(segment_lengths), dilation_rates=list(dilation_rates))
    if takes(pattern, "semantics"):
        options["semantics"] = semantics
    given = any(options.get(name) is not None for name in PARAMETERS["token_window"].fields)
    if not takes(pattern, "token_window") and not given:  # the module's default; given ones reach (and are refused)
        for name in PARAMETERS["token_window"].fields:
            options.pop(name, None)
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
    """A named block pattern (PATTERN_TABLE) with its parameters; `table(N, H)` gives the block table."""

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
        if self.name not in PATTERN_TABLE:
            raise ValueError(f"pattern={self.name!r} is unknown: use one of {', '.join(PATTERNS)}")
        for name in ("block_size", "global_blocks", "levels"):
            value = getattr(self, name)
            low = 1 if name == "block_size" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        self._check_window()
        self._check_token_window()
        if self.takes("segments"):
            segs, rates = validate_pattern(self.segment_lengths, self.dilation_rates, self.semantics)
            object.__setattr__(self, "segment_lengths", segs)
            object.__setattr__(self, "dilation_rates", rates)
        elif self.segment_lengths or self.dilation_rates:
            raise ValueError(
                f"pattern={self.name!r} does not use segment_lengths/dilation_rates: leave them out, "
                f"or use pattern={_named(USES_SEGMENTS)}"
            )

    def _check_window(self) -> None:
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0
        ):
            raise ValueError(
                f"window must be an integer >= 0 (blocks on each side of the diagonal), got {self.window!r}"
            )
        if self.window is not None and not self.takes("window"):
            raise ValueError(f"pattern={self.name!r} takes no window; pass window with one of {', '.join(USES_WINDOW)}")
        if self.density is not None:
            if not isinstance(self.density, (int, float)) or not 0 < self.density <= 1:
                raise ValueError(f"density must be in (0, 1], got {self.density!r}")
            if not self.takes("window"):
                raise ValueError(
                    f"pattern={self.name!r} takes no density: its density follows from segment_lengths and "
                    f"dilation_rates; pass density with one of {', '.join(USES_WINDOW)}"
                )
            if self.window is not None:
                raise ValueError("pass window or density, not both: density picks the window")

    def _check_token_window(self) -> None:
        for name in PARAMETERS["token_window"].fields:
            value = getattr(self, name)
            if value is None:
                continue
            if not self.takes("token_window"):
                raise ValueError(
                    f"{name} is a token window of pattern={_named(patterns_taking('token_window'))}; "
                    f"pattern={self.name!r} takes window (blocks) instead"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (tokens), got {value!r}")

    @property
    def kind(self) -> PatternKind:
        return PATTERN_TABLE[self.name]

    def takes(self, param: str) -> bool:
        return param in self.kind.params

    @property
    def token_level(self) -> bool:
        """Exact per token (the banded executor), its table only a cover."""
        return self.kind.token_pairs is not None

    @property
    def token_window(self) -> tuple[int, int]:
        """(left, right) tokens of the sliding_window pattern."""
        left = self.block_size if self.window_left is None else self.window_left
        return left, self.block_size if self.window_right is None else self.window_right

    def num_blocks(self, seq_len: int) -> int:
        return -(-seq_len // self.block_size)

    def _window_density(self, num_blocks: int, window: int) -> float:
        return self.kind.table(self, num_blocks, window).float().mean().item()

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
            if self._window_density(num_blocks, mid) < self.density:
                lo = mid + 1
            else:
                hi = mid
        candidates = {max(0, lo - 1), lo}
        return min(candidates, key=lambda w: abs(self._window_density(num_blocks, w) - self.density))

    def table(self, seq_len: int, num_heads: int) -> torch.Tensor:
        """(num_blocks, num_blocks) bool on the CPU; ValueError past MAX_TABLE_BLOCKS blocks per side."""
        nb = self.num_blocks(seq_len)
        if nb > MAX_TABLE_BLOCKS:
            raise ValueError(
                f"N={seq_len:,} in blocks of {self.block_size} is {nb:,} blocks per side: the block table "
                f"holds at most {MAX_TABLE_BLOCKS:,}; use a larger --block-size or a shorter --seq-len"
            )
        if self.takes("window"):
            return self.kind.table(self, nb, self.resolved_window(nb))
        return self.kind.table(self, seq_len, num_heads)

    def pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        """(query, key) pairs one (batch, head) attends: exact per token for a token-level pattern, by the
        table else."""
        if self.kind.token_pairs is not None:
            return self.kind.token_pairs(self, seq_len, causal)
        return attended_pairs(self.table(seq_len, num_heads), seq_len, self.block_size, causal)

    def label(self) -> str:
        """A compact name for tables and report rows, e.g. local(d=0.1,b=128); segments are reported
        in their own columns."""
        params = [PARAMETERS[p].label(self) for p in self.kind.params]
        return f"{self.name}({','.join([p for p in params if p is not None] + [f'b={self.block_size}'])})"

    def describe(self, seq_len: int | None = None) -> str:
        params = [PARAMETERS[p].describe(self, seq_len) for p in self.kind.params]
        return f"{self.name}({', '.join(params + [f'block {self.block_size}'])})"
