"""Command-line values: lengths, sizes."""

import pytest

from dattn_cli.workload import parse_seq_lens, parse_size


def test_parse_seq_lens():
    assert parse_seq_lens("4k,8k,32768") == [4096, 8192, 32768]
    assert parse_seq_lens("1m") == [2**20]
    with pytest.raises(ValueError, match="--seq-len: '4x' is not a length"):
        parse_seq_lens("4x")


def test_parse_size():
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("1.5g") == int(1.5e9)
    for bad in ("lots", "2 parsecs", "-1GiB"):
        with pytest.raises(ValueError, match="--max-memory"):
            parse_size(bad)


def test_size_units_decimal_and_binary():
    for unit, scale in (("k", 10**3), ("kb", 10**3), ("tb", 10**12), ("kib", 2**10), ("tib", 2**40), ("b", 1)):
        assert parse_size(f"3{unit.upper()}") == 3 * scale
