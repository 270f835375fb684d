"""Pattern cache and memory pool: hits, bounds, thread safety, switches."""

import threading

import pytest
import torch

from dattn_cli.kernels import (
    ImprovedDilatedAttention,
    MemoryPool,
    PatternCache,
    dilated_attention_reference,
    get_global_memory_pool,
    get_global_pattern_cache,
)
from tests.conftest import rel_err

STAT_KEYS_CACHE = {"hits", "misses", "evictions", "hit_rate", "entries", "bytes"}
STAT_KEYS_POOL = {"requests", "reuses", "reuse_rate", "bytes_held", "peak_bytes_held"}


def test_repeated_calls_hit_the_cache():
    m = ImprovedDilatedAttention([8, 16], [1, 2])
    q = torch.randn(1, 32, 2, 4)
    for _ in range(5):
        m(q, q, q)
    stats = get_global_pattern_cache().stats()
    assert STAT_KEYS_CACHE <= stats.keys()
    assert stats["misses"] == 2 and stats["hits"] == 8 and stats["entries"] == 2
    assert stats["hit_rate"] == pytest.approx(0.8)


def test_cache_off_means_no_lookups():
    m = ImprovedDilatedAttention([8, 16], [1, 2], use_pattern_cache=False)
    q = torch.randn(1, 32, 2, 4)
    m(q, q, q)
    assert get_global_pattern_cache().stats()["hits"] + get_global_pattern_cache().stats()["misses"] == 0


@pytest.mark.slow
def test_cache_is_bounded_over_1000_shapes():
    cache = PatternCache(max_entries=16)
    m = ImprovedDilatedAttention([8], [1])
    m.pattern_cache = cache
    for n in range(1, 1001):
        q = torch.randn(1, n, 1, 2)
        m(q, q, q)
    stats = cache.stats()
    assert stats["entries"] == 16 and stats["evictions"] == 1000 - 16 and len(cache) == 16


def test_cache_size_from_environment(monkeypatch):
    monkeypatch.setenv("DATTN_PATTERN_CACHE_SIZE", "3")
    assert PatternCache().max_entries == 3
    monkeypatch.setenv("DATTN_PATTERN_CACHE_SIZE", "0")
    with pytest.raises(ValueError, match="DATTN_PATTERN_CACHE_SIZE"):
        PatternCache()


def test_index_plans_are_cached_with_their_bytes():
    from dattn_cli.kernels import DilatedAttention

    m = DilatedAttention([8, 16], [1, 2], use_pattern_cache=True)
    q = torch.randn(1, 32, 2, 4)
    m(q, q, q)
    m(q, q, q)
    stats = get_global_pattern_cache().stats()
    assert stats["hits"] == 2 and stats["bytes"] == (32 * 2 + 32 * 2 // 2) * 8  # one int64 per kept (row, head)


def test_pool_reuses_and_stays_bounded():
    pool = MemoryPool(max_bytes=4096)
    a = pool.acquire((16, 16), torch.float32, "cpu")
    pool.release(a)
    b = pool.acquire((16, 16), torch.float32, "cpu")
    assert b is a
    pool.release(b)
    for n in range(1, 50):  # many distinct shapes: free bytes never exceed the bound
        pool.release(pool.acquire((n, 16), torch.float32, "cpu"))
        assert pool.stats()["bytes_free"] <= 4096
    stats = pool.stats()
    assert STAT_KEYS_POOL <= stats.keys() and stats["reuses"] == 1 and stats["requests"] == 51


def test_pool_serves_scratch_reuses_it_and_is_switchable():
    """Scratch: fp32 accumulators of half inputs and contiguous copies of dilated (r > 1) blocks."""
    pool = get_global_memory_pool()
    m = ImprovedDilatedAttention([8, 16], [1, 2])
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(1, 32, 2, 8, dtype=dtype, requires_grad=True)
        m(q, q, q).sum().backward()
        first = pool.stats()
        for _ in range(2):
            m(q, q, q).sum().backward()
        later = pool.stats()
        assert first["requests"] > 0
        assert later["requests"] - first["requests"] == 2 * first["requests"]  # same requests every call
        assert later["reuses"] - first["reuses"] == later["requests"] - first["requests"]  # all reused
        assert 0 < later["bytes_held"] <= later["peak_bytes_held"]
        pool.clear()
        pool.reset_stats()
    off = ImprovedDilatedAttention([8, 16], [1, 2], enable_memory_pool=False)
    q = torch.randn(1, 32, 2, 8, dtype=torch.bfloat16)
    assert rel_err(off(q, q, q), m(q, q, q)) == 0.0
    before = pool.stats()["requests"]
    off(q, q, q)
    assert pool.stats()["requests"] == before


def test_eight_threads_share_one_module_correctly():
    m = ImprovedDilatedAttention([8, 16, 32], [1, 2, 4])
    inputs = [
        [torch.randn(2, 40 + 8 * i, 3, 8, dtype=torch.bfloat16 if i % 2 else torch.float32) for _ in range(3)]
        for i in range(8)
    ]
    results, errors = [None] * 8, []

    def work(i):
        try:
            for _ in range(5):
                results[i] = m(*inputs[i], is_causal=True)
        except Exception as exc:  # surfaced below; a thread's exception would otherwise vanish
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(8):
        ref, _ = dilated_attention_reference(*inputs[i], [8, 16, 32], [1, 2, 4], True)
        tol = 1e-5 if inputs[i][0].dtype == torch.float32 else 3e-2
        assert rel_err(results[i], ref) <= tol
