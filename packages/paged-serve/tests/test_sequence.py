"""Sequence / SequenceGroup: the token bookkeeping the block manager reads (vLLM vllm/sequence.py)."""

from __future__ import annotations

import pytest
from paged_serve.core import Sequence, SequenceGroup, SequenceStatus


def test_sequence_tokens_blocks_and_fork():
    seq = Sequence(1, [5, 6, 7], block_size=2)
    assert seq.get_len() == 3 and seq.n_blocks == 2 and seq.get_last_token_id() == 7
    seq.append_token_id(8)
    assert seq.get_token_ids() == [5, 6, 7, 8] and seq.get_output_len() == 1 and seq.n_blocks == 2
    child = seq.fork(2)
    child.append_token_id(9)
    assert seq.get_token_ids() == [5, 6, 7, 8] and child.get_token_ids() == [5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="block_size"):
        Sequence(3, [1], block_size=0)


def test_sequence_group_status_queries():
    a, b = Sequence(1, [1], 4), Sequence(2, [1], 4)
    group = SequenceGroup("r", [a, b])
    b.status = SequenceStatus.RUNNING
    assert group.get_seqs(SequenceStatus.WAITING) == [a] and group.num_seqs(SequenceStatus.RUNNING) == 1
    a.status = SequenceStatus.FINISHED_STOPPED
    assert group.get_unfinished_seqs() == [b] and not group.is_finished()
    b.status = SequenceStatus.FINISHED_ABORTED
    assert group.is_finished()
    group.remove(1)
    with pytest.raises(ValueError, match="not in group"):
        group.find(1)
    with pytest.raises(ValueError, match="at least one"):
        SequenceGroup("empty", [])
