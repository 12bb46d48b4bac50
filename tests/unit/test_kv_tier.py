"""The worker's KV offload tier: blocks saved and loaded back byte for byte (host memory and disk, bf16 and fp8
caches), a plan that saves into a slot it also loads, read-ahead, and the faults: an unusable directory at start,
a disk that fills up while serving (logged once, the bytes not written still readable)."""

from __future__ import annotations

import errno
import logging
import time

import pytest
import torch

from rapid_llm.worker_proc import kv_tier
from rapid_llm.worker_proc.kv_tier import DiskKVTier, KVTier, open_tier
from tests.unit.random_kv_cache import random_kv_cache


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM", dtype=torch.bfloat16)


def _block(cache, block: int) -> list[torch.Tensor]:
    return [layer.kv_cache.view(torch.uint8).select(spec.block_dim, block).clone()
            for layer, spec in zip(cache.layers, cache.specs)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _tier(cache, where: str, tmp_path) -> KVTier:
    one = sum(cache.read_blocks(tensor, [0]).numel() for tensor in range(cache.num_tensors))
    tier = open_tier(cache, 4 * one, str(tmp_path) if where == "disk" else None)
    assert tier is not None and tier.num_slots == 4
    return tier


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("where", ["host", "disk"])
def test_a_block_saved_comes_back_byte_for_byte(checkpoint, tmp_path, where: str, cache_dtype: str) -> None:
    cache = random_kv_cache(checkpoint, cache_dtype)
    tier = _tier(cache, where, tmp_path)
    saved = [_block(cache, 1), _block(cache, 2)]
    tier.commit(tier.stage([(1, 0), (2, 3)]))
    cache.clear_blocks([1, 2])
    tier.load([(3, 5), (0, 6)])
    assert _same(_block(cache, 5), saved[1]) and _same(_block(cache, 6), saved[0])
    assert _same(_block(cache, 7), _block(cache, 7)) and not _same(_block(cache, 1), saved[0])


@pytest.mark.parametrize("where", ["host", "disk"])
def test_one_plan_evicts_and_reuses_a_block_and_loads_a_slot_it_overwrites(checkpoint, tmp_path, where: str) -> None:
    cache = random_kv_cache(checkpoint)
    tier = _tier(cache, where, tmp_path)
    old = _block(cache, 3)
    tier.commit(tier.stage([(3, 1)]))
    evicted = _block(cache, 4)
    # The plan: block 4 is evicted into slot 1 and handed out again, and slot 1's old block is loaded into block 4.
    staged = tier.stage([(4, 1)])
    tier.load([(1, 4)])
    tier.commit(staged)
    assert _same(_block(cache, 4), old)
    tier.load([(1, 0)])
    assert _same(_block(cache, 0), evicted)


def test_read_ahead_serves_a_later_load(checkpoint, tmp_path) -> None:
    cache = random_kv_cache(checkpoint)
    tier = _tier(cache, "disk", tmp_path)
    saved = _block(cache, 2)
    tier.commit(tier.stage([(2, 2)]))
    deadline = time.monotonic() + 10
    while tier._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    tier.prefetch([2])
    while not tier._prefetched and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 2 in tier._prefetched
    tier.load([(2, 7)])
    assert _same(_block(cache, 7), saved) and 2 not in tier._prefetched


def test_an_unusable_directory_leaves_the_server_without_a_tier(checkpoint, tmp_path, caplog) -> None:
    cache = random_kv_cache(checkpoint)
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with caplog.at_level(logging.WARNING):
        assert open_tier(cache, 1 << 20, str(not_a_directory)) is None
    assert "serving goes on without it" in caplog.text
    assert open_tier(cache, 1, None) is None, "a size below one block keeps no tier"


def test_a_full_disk_is_reported_once_and_loses_no_planned_load(checkpoint, tmp_path, monkeypatch, caplog) -> None:
    cache = random_kv_cache(checkpoint)
    tier = _tier(cache, "disk", tmp_path)
    assert isinstance(tier, DiskKVTier)

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kv_tier.os, "pwrite", full)
    saved = _block(cache, 1)
    with caplog.at_level(logging.WARNING):
        tier.commit(tier.stage([(1, 0)]))
        deadline = time.monotonic() + 10
        while not tier._error and time.monotonic() < deadline:
            time.sleep(0.01)
    error = tier.take_error()
    assert "No space left" in error and tier.take_error() == ""
    assert "serving goes on without it" in caplog.text
    tier.load([(0, 5)])
    assert _same(_block(cache, 5), saved), "a slot whose write failed is still read from memory"
