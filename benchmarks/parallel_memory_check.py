"""The whole-model memory model (plan/parallel.py) against what torch allocates under DDP and FSDP2.

Two gloo ranks on this CPU each train a small LongNetLM for two steps (forward, loss, backward, AdamW,
zero_grad) wrapped in torch DDP (--zero 0) or FSDP2 fully_shard per block and at the root (--zero 3,
reshard_after_forward), and count live tensor bytes (runtime.measure.LiveTensorBytes: every storage torch
allocates while it is alive) on top of the weights (or weight shards) that exist before the steps. The plan's
tensor items (device "cuda": no CPU runtime costs, no framework) are compared with rank 0's peak.

    python benchmarks/parallel_memory_check.py [--zero 0 --zero 3] [--seq-len 1024] [--layers 2] [--heads 2]
        [--vocab-size 2048]

Prints one line per layout: predicted and measured peak per device and the error.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dattn_cli.plan.layers import layer_memory  # noqa: E402
from dattn_cli.plan.parallel import Training, model_states  # noqa: E402
from dattn_cli.workload import Problem  # noqa: E402

WORLD = 2


def problem(seq_len: int, layers: int, heads: int = 2, vocab: int = 2048) -> Problem:
    return Problem(
        impl="ImprovedMultiheadDilatedAttention",
        target="model",
        layers=layers,
        heads=heads,
        head_dim=64,
        seq_len=seq_len,
        vocab_size=vocab,
        mode="fwdbwd",
        segment_lengths=[256, 512],
        dilation_rates=[1, 2],
    )


def _storages(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class LiveBytes:
    """Peak bytes of the storages torch creates inside the block, like runtime.measure.LiveTensorBytes, with
    three differences this check needs: a DTensor counts as its local shard (a dispatch mode sees a DTensor op's
    output, not the local ops inside it); a storage's size is read when the peak is sampled (FSDP2 frees and
    re-allocates unsharded parameters by resizing their storage, not by dropping it); and the storages given in
    `existing` (the weights or their shards, counted apart) are not counted when an op returns a view of them."""

    def __init__(self, existing=()):
        self.peak = 0
        self._storages: dict[int, object] = {}
        self._existing = [getattr(t, "_local_tensor", t).untyped_storage() for t in existing]
        self._ignored = {id(s) for s in self._existing}

    def track(self, t) -> None:
        import weakref

        t = getattr(t, "_local_tensor", t)
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self._ignored and key not in self._storages:
            self._storages[key] = weakref.ref(storage, lambda _, key=key: self._storages.pop(key, None))

    def sample(self) -> None:
        live = sum(s.nbytes() for ref in list(self._storages.values()) if (s := ref()) is not None)
        self.peak = max(self.peak, live)

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                tracker.sample()  # before the op: storages resized since the last one are seen at their size
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    tracker.track(t)
                tracker.sample()
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        return False


def _wrap(model, zero: int):
    if zero == 0:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _rank(rank: int, port: int, zero: int, shape: tuple, out) -> None:
    try:
        _steps(rank, port, zero, shape, out)
    except BaseException as exc:  # the parent stops at once instead of waiting on a queue
        out.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


def _steps(rank: int, port: int, zero: int, shape: tuple, out) -> None:
    from dattn_cli.kernels import reset_global_memory_pool
    from dattn_cli.models.longnet import LongNetLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    s = problem(*shape)
    reset_global_memory_pool()
    model = LongNetLM(
        s.vocab_size,
        s.width,
        s.heads,
        s.layers,
        attention=s.impl,
        mlp_ratio=s.mlp_ratio,
        segment_lengths=s.segment_lengths,
        dilation_rates=s.dilation_rates,
        semantics=s.semantics,
    )
    if zero == 3:
        _wrap(model, zero)  # before counting: the weight shards it leaves are `before`, the full weights are freed
    existing = list(model.parameters()) + list(model.buffers())
    before = _storages(existing)
    with LiveBytes(existing) as tracker:
        wrapped = _wrap(model, zero) if zero == 0 else model  # DDP's gradient buckets are counted
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(2):
            tokens = torch.randint(0, s.vocab_size, (1, s.seq_len + 1))
            logits = wrapped(tokens[:, :-1])  # through the wrapper: DDP's reducer, FSDP's gathers
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            logits = None
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = None
    if rank == 0:
        out.put((before + tracker.peak, before))
    dist.barrier()
    dist.destroy_process_group()


def measure(zero: int, shape: tuple) -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, zero, shape, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        answer = out.get(timeout=300)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if isinstance(answer, str):
        raise SystemExit(answer)
    return answer[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zero", type=int, action="append", choices=(0, 3))
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2, help="heads of 64: the width is 64 x heads")
    parser.add_argument("--vocab-size", type=int, default=2048)
    args = parser.parse_args()
    shape = (args.seq_len, args.layers, args.heads, args.vocab_size)
    s = problem(*shape)
    for zero in args.zero or (0, 3):
        states = model_states(s, Training(devices=WORLD, zero=zero, optimizer="adamw"), "cpu")  # for-loop AdamW
        predicted = layer_memory(s, 0, "cuda", states)
        measured = measure(zero, shape)
        print(
            f"--zero {zero} over {WORLD} gloo ranks, N={s.seq_len}, {s.layers} x E={s.width}, V={s.vocab_size}: "
            f"predicted "
            f"{predicted.total / 2**20:.2f} MiB ({predicted.phase}), measured {measured / 2**20:.2f} MiB, "
            f"error {100 * (predicted.total - measured) / measured:+.1f}%"
        )


if __name__ == "__main__":
    main()
