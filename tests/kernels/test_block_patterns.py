"""Block patterns: each table is what its definition says, density parameters control density, and
the longnet cover is exactly the block cover of the dilated pattern; a pattern is one PATTERN_TABLE entry."""

import pytest
import torch

from dattn_cli.kernels import BlockSparseRingDilatedAttention
from dattn_cli.kernels.block_sparse.patterns import (
    PATTERN_TABLE,
    PATTERNS,
    BlockPattern,
    PatternKind,
    attended_pairs,
    block_sparse_options,
    takes,
)
from dattn_cli.kernels.reference import pair_counts
from tests.conftest import rel_err


def test_local_window_is_a_band():
    table = BlockPattern("local", block_size=4, window=2).table(40, 1)
    i = torch.arange(10)
    assert torch.equal(table, (i[:, None] - i[None, :]).abs() <= 2)


def test_dilated_blocks_follow_segments_and_rates():
    table = BlockPattern("dilated", block_size=4, segment_lengths=(16, 32), dilation_rates=(1, 2)).table(32, 1)
    # pair (16, 1): 4-block segments, every block; pair (32, 2): the whole sequence, even block distances
    assert table[0, 4]  # even distance
    assert table[0, 3] and not table[0, 5]  # same 4-block segment / different segment and odd distance
    assert table[0, 6] and not table[1, 6]  # distance 6 (even) / distance 5 (odd, different 4-block segment)
    assert torch.equal(table, table.T)


def test_global_local_globals_see_and_are_seen_by_all():
    table = BlockPattern("global_local", block_size=1, window=1, global_blocks=2).table(12, 1)
    assert table[:2].all() and table[:, :2].all()
    assert not table[5, 9] and table[5, 6]


def test_hierarchical_levels_are_progressively_dilated():
    table = BlockPattern("hierarchical", block_size=1, window=1, levels=2).table(32, 1)
    row = table[16].nonzero().flatten() - 16
    assert set(row.tolist()) == {-8, -4, -2, -1, 0, 1, 2, 4, 8}


@pytest.mark.parametrize("semantics", ["longnet", "head_groups"])
@pytest.mark.parametrize("seq_len,block", [(64, 8), (50, 8), (45, 6)])
def test_longnet_is_the_exact_block_cover_of_the_dilated_pattern(semantics, seq_len, block):
    segs, rates, heads = (16, 32), (1, 3), 4
    table = BlockPattern(
        "longnet", block_size=block, segment_lengths=segs, dilation_rates=rates, semantics=semantics
    ).table(seq_len, heads)
    counts = pair_counts(torch.arange(seq_len), seq_len, heads, segs, rates, semantics, False).sum(0) > 0
    nb = table.shape[0]
    padded = torch.zeros(nb * block, nb * block, dtype=torch.bool)
    padded[:seq_len, :seq_len] = counts
    cover = padded.view(nb, block, nb, block).any(dim=3).any(dim=1)
    assert torch.equal(table, cover)


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["local", "global_local", "hierarchical"])
@pytest.mark.parametrize("target", [0.05, 0.1, 0.25, 0.5])
def test_density_parameter_controls_density(pattern, target):
    p = BlockPattern(pattern, block_size=128, density=target)
    table = p.table(32768, 8)
    density = table.float().mean().item()
    # the best window is within one window step of the target
    w = p.resolved_window(256)
    steps = [
        BlockPattern(pattern, block_size=128, window=max(0, w + d)).table(32768, 8).float().mean().item()
        for d in (-1, 1)
    ]
    assert abs(density - target) <= max(abs(s - density) for s in steps)
    assert abs(density - target) < 0.05


def test_more_density_means_more_blocks():
    densities = [BlockPattern("local", density=d).table(32768, 1).float().mean().item() for d in (0.05, 0.1, 0.25)]
    assert densities == sorted(densities) and densities[0] < 0.07 and densities[2] > 0.2


def test_attended_pairs_counts_causal_and_ragged_exactly():
    seq_len, block = 50, 8
    table = BlockPattern("local", block_size=block, window=1).table(seq_len, 1)
    keys = torch.arange(seq_len)
    dense = table[keys[:, None] // block, keys[None, :] // block]
    assert attended_pairs(table, seq_len, block, False) == int(dense.sum())
    assert attended_pairs(table, seq_len, block, True) == int((dense & (keys[None, :] <= keys[:, None])).sum())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(name="diagonal"), "pattern='diagonal' is unknown"),
        (dict(name="local", block_size=0), "block_size must be an integer >= 1"),
        (dict(name="local", window=-1), "window must be an integer >= 0"),
        (dict(name="local", density=1.5), "density must be in (0, 1]"),
        (dict(name="local", density=0.1, window=3), "pass window or density, not both"),
        (dict(name="dilated", density=0.1, segment_lengths=(8,), dilation_rates=(1,)), "takes no density"),
        (dict(name="local", segment_lengths=(8,), dilation_rates=(1,)), "does not use segment_lengths"),
        (dict(name="dilated"), "segment_lengths is empty"),
    ],
)
def test_bad_pattern_options_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BlockPattern(**kwargs)


def test_every_pattern_has_a_description():
    for name in PATTERNS:
        extra = dict(segment_lengths=(16,), dilation_rates=(2,)) if name in ("dilated", "longnet") else {}
        assert BlockPattern(name, **extra).describe().startswith(name)


def test_window_is_refused_where_the_pattern_takes_none():
    with pytest.raises(ValueError, match="pattern='dilated' takes no window"):
        BlockPattern("dilated", window=2, segment_lengths=(8,), dilation_rates=(1,))


def test_a_pattern_is_one_table_entry(monkeypatch):
    """A pattern added to PATTERN_TABLE alone is checked, labelled, described, passed its options and run by
    the module, exact against the dense reference."""

    def backward_band(p, num_blocks, window):  # a window of key blocks before the query block only
        d = torch.arange(num_blocks)[:, None] - torch.arange(num_blocks)[None, :]
        return (d >= 0) & (d <= window)

    monkeypatch.setitem(PATTERN_TABLE, "backward", PatternKind(("window",), backward_band))
    pattern = BlockPattern("backward", block_size=4, window=2)
    assert pattern.label() == "backward(w=2,b=4)" and pattern.describe() == "backward(window 2, block 4)"
    assert takes("backward", "window") and not takes("backward", "segments")
    assert torch.equal(pattern.table(40, 1), backward_band(pattern, 10, 2))
    assert 0 < BlockPattern("backward", block_size=4, density=0.3).resolved_window(10) < 10
    with pytest.raises(ValueError, match="pattern='backward' does not use segment_lengths"):
        BlockPattern("backward", segment_lengths=(8,), dilation_rates=(1,))
    with pytest.raises(ValueError, match="window_left is a token window of pattern='sliding_window'"):
        BlockPattern("backward", window_left=3)
    options = block_sparse_options("backward", [8], [1], "head_groups", window=1, global_blocks=2, levels=3)
    assert options == {"pattern": "backward", "window": 1}
    module = BlockSparseRingDilatedAttention(block_size=4, **options)
    q, k, v = (torch.randn(2, 30, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse = module.forward_with_lse(q, k, v)
    ref, ref_lse = module.reference(q, k, v)
    assert rel_err(out, ref) <= 1e-10 and rel_err(lse, ref_lse) <= 1e-6  # the reference returns lse in fp32
