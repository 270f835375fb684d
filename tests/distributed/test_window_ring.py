"""The sliding window's ring form (kernels/block_sparse/halo.py) on gloo at p = 2 and 4: shards equal the dense
band reference (forward, lse, gradients; GQA, key padding, causal), including windows wider than a shard, and
the bytes each rank moves equal comm_volume: the halo rows only."""

import pytest
import torch

from dattn_cli.kernels.reference import sliding_window_reference
from dattn_cli.runtime.launch import run_distributed
from tests.conftest import rel_err
from tests.distributed import gqa_workers as w

KEYS = ("forward_bytes_sent", "forward_bytes_received", "backward_bytes_sent", "backward_bytes_received")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_window_shards_equal_the_reference_and_move_only_halos(world):
    per_rank = run_distributed(w.window_cases, world, timeout_s=180)
    for left, right, causal in per_rank[0]:
        q, k, v, up = w.inputs(2, causal)
        mask = torch.rand(w.B, w.N, generator=torch.Generator().manual_seed(left)) < 0.2
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        ref, ref_lse = sliding_window_reference(q, k, v, left, right, causal, key_padding_mask=mask)
        grads = torch.autograd.grad(ref, (q, k, v), up)
        key = (left, right, causal)
        join = lambda name, j=None: torch.cat(
            [
                r[key][name] if j is None else r[key][name][j]  # noqa: E731
                for r in per_rank
            ],
            1,
        )
        assert rel_err(join("out"), ref) <= 1e-12, key
        finite = torch.isfinite(ref_lse)
        assert rel_err(join("lse")[finite].double(), ref_lse[finite].double()) <= 1e-6, key
        for j in range(3):  # (a one-key window has dq = 0 exactly: compare against the largest gradient)
            assert (join("grads", j) - grads[j]).abs().max() <= 1e-12 * max(1.0, grads[j].abs().max().item()), (key, j)
        for r in per_rank:
            assert {k: r[key]["comm"][k] for k in KEYS} == r[key]["volume"], key
        # a rank receives at most the window's rows: left before it, right after it (non-causal)
        row = w.B * (2 * 2 * w.D + 1) * 8
        assert all(
            r[key]["comm"]["forward_bytes_received"] <= (left + (0 if causal else right)) * row for r in per_rank
        )
