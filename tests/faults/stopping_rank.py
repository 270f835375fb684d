"""A plugin for tests/faults/test_processes.py (loaded through DATTN_PLUGINS): ring attention whose rank 1
stops itself (SIGSTOP) in its first forward, as a rank frozen by a debugger, a swapped-out node or a bug does.
Its peers then wait in a collective until the group's timeout."""

import os
import signal

from dattn_cli.kernels.distributed.ring import RingDilatedAttention
from dattn_cli.kernels.registry import ImplSpec, register, segment_aligned_shards


class StoppingRingAttention(RingDilatedAttention):
    def forward_with_lse(self, *args, **kwargs):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().forward_with_lse(*args, **kwargs)


register(
    ImplSpec(
        "StoppingRingAttention",
        StoppingRingAttention,
        "core",
        "ring",
        "rank 1 stops itself: tests/faults/stopping_rank.py",
        distributed=True,
        single_device=False,
        shard_rule=segment_aligned_shards,
    )
)
