"""kernels/pattern.py: a block's rows reached in one call."""

import pytest
import torch

from dattn_cli.kernels.pattern import build_blocks


@pytest.mark.parametrize("semantics", ["longnet", "head_groups"])
@pytest.mark.parametrize("n", [40, 64, 100])
def test_strided_is_the_view_in_one_call(n, semantics):
    """Block.strided (one as_strided, the engine's gathers) equals Block.view on every block: ragged tails, w > N,
    w % r != 0, a non-contiguous input and a slice of a longer sequence (a chunk) included."""
    x = torch.randn(2, 2 * n, 6, 8).transpose(2, 3).contiguous().transpose(2, 3)[:, n // 2 : n // 2 + n]
    for block in build_blocks(n, 6, [16, 48, 128], [1, 3, 4], semantics):
        view, strided = block.view(x), block.strided(x)
        assert view.shape == strided.shape and view.stride() == strided.stride()
        assert view.storage_offset() == strided.storage_offset() and torch.equal(view, strided)
