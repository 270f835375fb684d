"""dattn's attention in a Hugging Face Llama (transformers' AttentionInterface): on one process and, with the
sequence sharded over 2 and 4 gloo ranks, logits, loss and summed parameter gradients equal the single-process
model's: the eager model for the dense ring, dattn's single-process dilated attention for the dilated ring and
the hybrid h x ring (2x1 and 2x2; both change the model's attention on purpose)."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AttentionInterface  # noqa: E402

from dattn_cli.integrations import transformers as hf  # noqa: E402
from dattn_cli.runtime.launch import run_distributed  # noqa: E402
from tests.conftest import rel_err  # noqa: E402
from tests.integrations import hf_workers  # noqa: E402

TOLERANCE = 1e-5  # fp32: the ring's merge sums in another order than one softmax
# name -> its reference
CONTEXT_PARALLEL = {"dattn_ring": "eager", "dattn_ring_dilated": "dattn_dilated", "dattn_hybrid": "dattn_dilated"}


def assert_same_step(got: dict, want: dict, where) -> None:
    assert rel_err(got["logits"], want["logits"]) <= TOLERANCE, where
    assert abs(got["loss"].item() - want["loss"].item()) <= TOLERANCE * want["loss"].item(), where
    assert got["grads"].keys() == want["grads"].keys()
    for name, grad in want["grads"].items():
        assert rel_err(got["grads"][name], grad) <= TOLERANCE, (where, name)


def test_every_name_is_registered():
    assert hf.NAMES == ("dattn_ring", "dattn_dilated", "dattn_ring_dilated", "dattn_hybrid")
    assert all(name in AttentionInterface() for name in hf.NAMES)
    assert hf.register() == hf.NAMES  # again: harmless


@pytest.mark.parametrize("name, reference", [*CONTEXT_PARALLEL.items(), ("dattn_dilated", "dattn_ring_dilated")])
def test_one_process_equals_its_reference(name, reference):
    assert_same_step(hf_workers.context_parallel_step(0, 1, name), hf_workers.single_process_step(reference), name)


def test_the_hybrid_size_comes_from_the_config():
    from transformers import LlamaConfig

    config = LlamaConfig(**hf_workers.CONFIG)
    assert hf._hybrid_size(config, 4) == 2  # the default where 2 divides the ranks and heads
    assert hf._hybrid_size(config, 3) == 1
    config.dattn_head_parallel_size = 4
    assert hf._hybrid_size(config, 4) == 4
    assert hf._hybrid_size(config, 4, head_parallel_size=1) == 1


def test_dilated_attention_changes_the_model():
    dense, dilated = (hf_workers.single_process_step(name)["logits"] for name in ("eager", "dattn_dilated"))
    assert rel_err(dilated, dense) > 1e-3


def test_the_dattn_module_stays_outside_the_state_dict():
    model = hf_workers.build_model("dattn_ring")
    keys = set(model.state_dict())
    model(hf_workers.token_ids())
    assert set(model.state_dict()) == keys
    assert any(hf._CACHE in vars(m) for m in model.modules())
    hf.set_process_group(model, None)  # a new group: modules are made again
    assert not any(hf._CACHE in vars(m) for m in model.modules())


def test_refusals_name_the_fix():
    model = hf_workers.build_model("dattn_ring")
    attention = model.model.layers[0].self_attn
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    ring = hf.REGISTRATIONS[0]
    with pytest.raises(ValueError, match="pass use_cache=False"):
        hf.attention_forward(ring, attention, q[:, :, :1], k, k, None)
    with pytest.raises(ValueError, match="takes no attention mask"):
        hf.attention_forward(ring, attention, q, k, k, torch.ones(1, 1, 8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_dropout = 0"):
        hf.attention_forward(ring, attention, q, k, k, None, dropout=0.1)
    with pytest.raises(ValueError, match="does not apply sliding_window"):
        hf.attention_forward(ring, attention, q, k, k, None, sliding_window=4)
    attention.config.dattn_segment_lengths = None
    with pytest.raises(ValueError, match="set the config's dattn_segment_lengths"):
        hf.attention_forward(hf.REGISTRATIONS[1], attention, q, k, k, None)


def test_the_batch_is_shifted_before_sharding():
    ids = torch.arange(8).view(1, 8)
    batch = hf.shard_causal_lm_batch(ids)
    assert batch["labels"].tolist() == [[1, 2, 3, 4, 5, 6, 7, -100]]
    assert batch["position_ids"].tolist() == [list(range(8))]
    assert batch["num_items_in_batch"].item() == 7


@pytest.fixture(scope="module", params=[2, 4])
def sharded(request):
    world = request.param
    return world, run_distributed(hf_workers.context_parallel_steps, world, list(CONTEXT_PARALLEL), timeout_s=180)


def assert_sharded_step(per_rank: list[dict], reference: str, where) -> None:
    """The ranks' logits shards, in order, and rank 0's loss and gradients are the reference's; every rank holds
    the same loss and gradients."""
    got = {
        "logits": torch.cat([r["logits"] for r in per_rank], dim=1),
        "loss": per_rank[0]["loss"],
        "grads": per_rank[0]["grads"],
    }
    assert_same_step(got, hf_workers.single_process_step(reference), where)
    for rank, r in enumerate(per_rank[1:], 1):
        assert torch.equal(r["loss"], got["loss"]), (where, rank)
        assert all(torch.equal(r["grads"][n], g) for n, g in got["grads"].items()), (where, rank)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONTEXT_PARALLEL))
def test_context_parallel_equals_the_single_process_model(sharded, name):
    world, per_rank = sharded
    assert_sharded_step([r[name] for r in per_rank], CONTEXT_PARALLEL[name], (name, world))
    if name == "dattn_hybrid":  # h = 2 by default: 2x1, 2x2
        assert per_rank[0][name]["modules"] == [f"HybridDilatedAttention 2x{world // 2} over {world} rank(s)"]


@pytest.mark.slow
def test_hybrid_inside_sequence_parallel_groups(sharded):
    world, per_rank = sharded
    if world != 4:
        pytest.skip("dp x sp on 4 ranks only")
    for replica in (per_rank[:2], per_rank[2:]):
        assert_sharded_step([r["dattn_hybrid sp"] for r in replica], "dattn_dilated", ("dattn_hybrid sp", replica))
    assert per_rank[0]["dattn_hybrid sp"]["modules"] == ["HybridDilatedAttention 2x1 over 2 rank(s)"]
