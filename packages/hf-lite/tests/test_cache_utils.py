"""DynamicCache: append per layer, reorder rows for beam search, crop, legacy tuples; same API as transformers'."""

import pytest
import torch
import transformers
from hf_lite import DynamicCache


def _kv(batch, seq, fill):
    return torch.full((batch, 2, seq, 4), float(fill)), torch.full((batch, 2, seq, 4), float(-fill))


def test_update_appends_and_matches_transformers_cache():
    ours, theirs = DynamicCache(), transformers.DynamicCache()
    for step, seq in enumerate([5, 1, 1]):
        for layer in range(2):
            k, v = _kv(3, seq, step + layer)
            a = ours.update(k, v, layer)
            b = theirs.update(k, v, layer)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert ours.get_seq_length() == theirs.get_seq_length() == 7
    assert len(ours) == 2


def test_reorder_crop_and_legacy_round_trip():
    cache = DynamicCache()
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 4).contiguous()
    cache.update(k, -k, 0)
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    assert cache[0][0][:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache[0][1][:, 0, 0, 0].tolist() == [-2.0, -2.0, -0.0]
    cache.crop(3)
    assert cache.get_seq_length() == 3
    again = DynamicCache.from_legacy_cache(cache.to_legacy_cache())
    assert torch.equal(again[0][0], cache[0][0])
    with pytest.raises(ValueError, match="layer 2 updated before layer 1"):
        cache.update(k, k, 2)
