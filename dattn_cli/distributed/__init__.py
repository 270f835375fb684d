"""Running code on p ranks of a torch.distributed group (gloo on CPU, NCCL on GPU)."""

from .launch import DistributedError, free_port, run_distributed

__all__ = ["DistributedError", "free_port", "run_distributed"]
