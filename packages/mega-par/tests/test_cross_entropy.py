"""Vocab-parallel cross-entropy against the numbers Megatron's own test expects.

Ports Megatron-LM's ``tests/unit_tests/tensor_parallel/test_cross_entropy.py`` (test_vocab_parallel_cross_entropy)
to mega_par at the same tensor-parallel size, 4: every rank holds logits 0..7 repeated over its 32-entry vocab
slice, targets 0, 2, ..., 30 all fall in rank 0's slice, and the loss rounds to upstream's values. Also checked
against ``F.cross_entropy`` on the gathered logits. Runs inside the package's shared 8-rank run (``rank_cases``).
Upstream's explicit ``tp_group`` cases run here in one process: the loss reads the given group, never
parallel_state, and ``LanguageModule.compute_language_model_loss`` hands its ``tp_group`` on. One difference
from upstream: on a group of one rank mega_par makes no all-reduce (Megatron makes three, each a no-op there), so
where upstream's test lists three calls this one lists none.
"""

import importlib.util
import pathlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from mega_par import parallel_state as ps
from mega_par.models.common.language_module import language_module as language_module_module
from mega_par.tensor_parallel import cross_entropy as cross_entropy_module
from mega_par.tensor_parallel import vocab_parallel_cross_entropy

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

UPSTREAM = [10.2309, 8.2309, 6.2309, 4.2309] * 4


def _vocab_parallel_cross_entropy(rank, world):
    ps.initialize_model_parallel(4, 1)
    try:
        logits = torch.arange(0, 8, dtype=torch.float32).repeat(16, 4)  # [16, 32] on every rank
        target = torch.arange(0, 32, 2)
        out = vocab_parallel_cross_entropy(logits, target)
        assert torch.equal(torch.round(out), torch.round(torch.tensor(UPSTREAM))), out
        torch.testing.assert_close(out, torch.tensor(UPSTREAM), rtol=0, atol=1e-4)
        full = logits.repeat(1, 4)  # the gathered [16, 128] logits
        torch.testing.assert_close(out, F.cross_entropy(full, target, reduction="none"))
    finally:
        ps.destroy_model_parallel()


CASES = {"vocab_parallel_cross_entropy": _vocab_parallel_cross_entropy}


def rank_cases(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.mark.world_size(4)
@pytest.mark.parametrize("case", list(CASES))
def test_cross_entropy_at_tp4(mega_par_ranks, case):
    H.assert_case(H.job_results(mega_par_ranks, "test_cross_entropy"), case)


class _FakeTPGroup:
    def rank(self):
        return 0

    def size(self):
        return 1


def test_vocab_parallel_cross_entropy_uses_explicit_tp_group(monkeypatch):
    tp_group = _FakeTPGroup()
    all_reduce_groups = []

    def fake_all_reduce(tensor, op=None, group=None):
        all_reduce_groups.append(group)
        return tensor

    def fail_parallel_state_call(*args, **kwargs):
        raise AssertionError("explicit tp_group should avoid parallel_state")

    monkeypatch.setattr(torch.distributed, "all_reduce", fake_all_reduce)
    monkeypatch.setattr(cross_entropy_module, "get_tensor_model_parallel_group", fail_parallel_state_call)
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, -0.5, 1.0]])
    target = torch.tensor([2, 0])
    expected = F.cross_entropy(logits.clone(), target, reduction="none")
    output = vocab_parallel_cross_entropy(logits, target, tp_group=tp_group)
    torch.testing.assert_close(output, expected)
    assert all_reduce_groups == []  # upstream: [tp_group] * 3 (see the module docstring)
    with pytest.raises(AssertionError, match="explicit tp_group"):
        vocab_parallel_cross_entropy(logits, target)  # without it, parallel_state is asked: the check can fail


def test_language_module_unfused_loss_passes_tp_group(monkeypatch):
    tp_group = _FakeTPGroup()
    captured = {}

    def fake_vocab_parallel_cross_entropy(logits, labels, label_smoothing=0.0, tp_group=None):
        captured.update(logits=logits, labels=labels, label_smoothing=label_smoothing, tp_group=tp_group)
        return torch.zeros_like(labels, dtype=logits.dtype)

    monkeypatch.setattr(language_module_module.tensor_parallel, "vocab_parallel_cross_entropy",
                        fake_vocab_parallel_cross_entropy)
    module = SimpleNamespace(config=SimpleNamespace(cross_entropy_loss_fusion=False), tp_group=tp_group)
    labels = torch.tensor([[0, 1, 2], [2, 1, 0]])
    logits = torch.randn(3, 2, 4)
    loss = language_module_module.LanguageModule.compute_language_model_loss(module, labels=labels, logits=logits)
    assert captured["logits"] is logits
    assert captured["tp_group"] is tp_group
    assert captured["label_smoothing"] == 0.0
    torch.testing.assert_close(captured["labels"], labels.transpose(0, 1).contiguous())
    assert loss.shape == labels.shape
