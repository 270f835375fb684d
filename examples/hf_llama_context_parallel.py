"""A Hugging Face Llama trained with its sequence sharded over the ranks (context parallel), dattn's attention
selected by name through transformers' AttentionInterface. gloo on CPU, NCCL on CUDA (one process per GPU).

    torchrun --nproc-per-node 2 examples/hf_llama_context_parallel.py
    torchrun --nproc-per-node 2 examples/hf_llama_context_parallel.py --attn dattn_ring_dilated
    torchrun --nproc-per-node 4 examples/hf_llama_context_parallel.py --attn dattn_hybrid  # 2x2: h x ring

A tiny Llama (random weights from one seed, nothing downloaded) on every rank; each rank runs it on its shard of
the tokens with the global position ids and the labels shifted before sharding, its loss is its sum of token
losses over the global token count, and the gradients are summed over the ranks before the optimizer step.
Rank 0 also runs the first step's batch through one process, on the whole sequence: `dattn_ring` (exact dense
attention) must give the eager model's loss, `dattn_ring_dilated` and `dattn_hybrid` dattn's single-process
dilated attention's (dilated attention is another attention than the dense one the model would otherwise use).
"""

import argparse
import os

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from dattn_cli.integrations import transformers as hf

REFERENCE = {"dattn_ring": "eager", "dattn_ring_dilated": "dattn_dilated", "dattn_hybrid": "dattn_dilated"}


def setup() -> torch.device:
    if not torch.cuda.is_available():
        dist.init_process_group("gloo")
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl")
    return device


def build_model(attn: str, seq_len: int, device: torch.device) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=seq_len,
        use_cache=False,
        attn_implementation=attn,
        dattn_segment_lengths=[seq_len // 4, seq_len],  # read by the dilated names only
        dattn_dilation_rates=[1, 2],
    )
    torch.manual_seed(0)  # the same weights on every rank
    return LlamaForCausalLM(config).to(device)


def single_process_loss(model: LlamaForCausalLM, attn: str, ids: torch.Tensor) -> float:
    reference = build_model(REFERENCE[attn], ids.shape[1], ids.device)
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        return reference(ids, labels=ids).loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attn", choices=sorted(REFERENCE), default="dattn_ring")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(args.attn, args.seq_len, device)
    if args.attn == "dattn_hybrid":  # its head and ring groups, made on every rank together
        hf.setup_hybrid(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, args.seq_len), generator=torch.Generator().manual_seed(1)).to(device)
    if rank == 0:
        print(f"world {world}, {args.attn}, N = {args.seq_len} ({args.seq_len // world} tokens a rank) on {device}")
        reference = single_process_loss(model, args.attn, ids)
    for step in range(1, args.steps + 1):
        batch = hf.shard_causal_lm_batch(ids, segment_lengths=model.config.dattn_segment_lengths)
        loss = model(**batch).loss
        loss.backward()
        hf.all_reduce_gradients(model)
        optimizer.step()
        optimizer.zero_grad()
        total = hf.all_reduce_loss(loss).item()
        if rank == 0:
            check = f" (one process, {REFERENCE[args.attn]}: {reference:.6f})" if step == 1 else ""
            print(f"step {step}/{args.steps} loss {total:.6f}{check}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
