"""Stopping criteria: max length, max new tokens, EOS (several ids), stop strings, max time."""

import time

import pytest
import torch
from hf_lite.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxNewTokensCriteria,
    MaxTimeCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)


def test_max_length_and_max_new_tokens():
    ids = torch.zeros(2, 5, dtype=torch.long)
    assert MaxLengthCriteria(5)(ids).tolist() == [True, True]
    assert MaxLengthCriteria(6)(ids).tolist() == [False, False]
    assert MaxNewTokensCriteria(3, 2)(ids).tolist() == [True, True]
    assert MaxNewTokensCriteria(3, 3)(ids).tolist() == [False, False]
    with pytest.raises(ValueError, match="max_length"):
        MaxLengthCriteria(0)


def test_eos_several_ids_per_row():
    ids = torch.tensor([[1, 7], [1, 9], [7, 1]])
    assert EosTokenCriteria([7, 9])(ids).tolist() == [True, True, False]
    assert EosTokenCriteria(1)(ids).tolist() == [False, False, True]


def test_max_time():
    ids = torch.zeros(1, 1, dtype=torch.long)
    assert MaxTimeCriteria(0.5, initial_timestamp=time.time() - 1)(ids).tolist() == [True]
    assert MaxTimeCriteria(60)(ids).tolist() == [False]


class _CharTokenizer:
    """One character per id (id = ord), enough to exercise stop strings."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_stop_strings_stop_when_the_string_ends_in_the_newest_token():
    crit = StopStringCriteria(_CharTokenizer(), ["stop", "\n\n"])
    rows = [list(map(ord, s)) for s in ["I will stop", "I will sto", "stop then go", "a\n\n"]]
    width = max(map(len, rows))
    ids = torch.tensor([[32] * (width - len(r)) + r for r in rows])
    assert crit(ids).tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="stop_strings"):
        StopStringCriteria(_CharTokenizer(), [""])


def test_list_or_combines_and_reports_max_length():
    lst = StoppingCriteriaList([MaxLengthCriteria(10), EosTokenCriteria(3)])
    assert lst(torch.tensor([[1, 3], [1, 2]])).tolist() == [True, False]
    assert lst.max_length == 10
