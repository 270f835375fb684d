"""A plugin for tests/faults/test_launcher_jobs.py (loaded through DATTN_PLUGINS): ring attention with a fault
injected on one rank at one sequence length, in the first attempt of a torchrun group only (a restarted group
runs clean). DATTN_FAULT="ACTION:RANK:N": ACTION is kill (SIGKILL itself), stop (SIGSTOP itself), raise (a
ValueError: bad input on that rank alone), oom (torch.OutOfMemoryError, as CUDA raises it) or hold (sleep 600 s,
so its peers wait in a collective: for signals sent meanwhile); ACTION "hold-all" holds every rank at N.
DATTN_FAULT_MARK: a file the faulty rank writes "TIME PID" to just before its fault."""

import os
import signal
import time

from dattn_cli.kernels.distributed.ring import RingDilatedAttention
from dattn_cli.kernels.registry import ImplSpec, register, segment_aligned_shards


def _fault(rank: int, n: int) -> str | None:
    spec = os.environ.get("DATTN_FAULT", "")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    action, at_rank, at_n = spec.split(":")
    if int(at_n) != n or (action != "hold-all" and int(at_rank) != rank):
        return None
    return action


class FaultyRingAttention(RingDilatedAttention):
    def forward_with_lse(self, q, *args, **kwargs):  # forward() goes through it too
        import torch
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        action = _fault(rank, q.shape[1] * (dist.get_world_size() if dist.is_initialized() else 1))
        if action and os.environ.get("DATTN_FAULT_MARK"):  # when the fault came, for the test's timings
            with open(os.environ["DATTN_FAULT_MARK"], "w") as mark:
                mark.write(f"{time.time()} {os.getpid()}")
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif action == "raise":
            raise ValueError(f"injected bad input on rank {rank}")
        elif action == "oom":
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected on rank {rank})")
        elif action in ("hold", "hold-all"):
            time.sleep(600)
        return super().forward_with_lse(q, *args, **kwargs)


register(
    ImplSpec(
        "FaultyRingAttention",
        FaultyRingAttention,
        "core",
        "ring",
        "a fault on one rank at one N: tests/plugins/faulty_ring.py",
        distributed=True,
        single_device=False,
        shard_rule=segment_aligned_shards,
    )
)
