"""Learning-rate schedules and the weight-decay parameter split, against transformers' own functions.

Mirrors transformers' tests/optimization/test_optimization.py (ScheduleInitTest: each schedule's lr curve, and
that its state_dict reloads into a fresh scheduler) and tests/trainer/test_trainer.py::test_no_wd_param_group."""

import pickle

import pytest
import torch
import transformers
from hf_lite import get_scheduler
from hf_lite.optimization import get_decay_parameter_names
from hf_lite_testing import trainer_model


def _curve(make, steps=12):
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=10.0)
    scheduler = make(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return lrs, scheduler


CASES = [
    ("linear", dict(num_warmup_steps=3, num_training_steps=10), None),
    ("linear", dict(num_warmup_steps=0, num_training_steps=10), None),
    ("cosine", dict(num_warmup_steps=2, num_training_steps=10), None),
    ("cosine", dict(num_warmup_steps=2, num_training_steps=10), {"num_cycles": 1.5}),
    ("constant", dict(), None),
    ("constant_with_warmup", dict(num_warmup_steps=4), None),
]


@pytest.mark.parametrize("name, kw, extra", CASES)
def test_schedules_match_transformers(name, kw, extra):
    ours, scheduler = _curve(lambda opt: get_scheduler(name, opt, scheduler_specific_kwargs=extra, **kw))
    theirs, _ = _curve(lambda opt: transformers.get_scheduler(name, opt, scheduler_specific_kwargs=extra, **kw))
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)
    # the state reloads (and pickles, as torch.save needs): a fresh scheduler continues the same curve
    state = pickle.loads(pickle.dumps(scheduler.state_dict()))
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=10.0)
    fresh = get_scheduler(name, optimizer, scheduler_specific_kwargs=extra, **kw)
    fresh.load_state_dict(state)
    assert fresh.get_last_lr() == scheduler.get_last_lr()


def test_schedule_argument_errors():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="requires `num_warmup_steps`"):
        get_scheduler("linear", opt, num_training_steps=3)
    with pytest.raises(ValueError, match="requires `num_training_steps`"):
        get_scheduler("cosine", opt, num_warmup_steps=1)
    with pytest.raises(TypeError, match=r"unexpected lr_scheduler_kwargs \['power'\]"):
        get_scheduler("linear", opt, 1, 3, scheduler_specific_kwargs={"power": 2})
    with pytest.raises(ValueError, match="'polynomial' is not a valid SchedulerType"):
        get_scheduler("polynomial", opt, 1, 3)


@pytest.mark.parametrize("bias", [False, True])
def test_decay_parameter_names_match_transformers_trainer(bias, tmp_path):
    ours = trainer_model(vocab_size=97, attention_bias=bias, mlp_bias=bias)
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    expected = transformers.Trainer.get_decay_parameter_names(None, theirs)
    assert get_decay_parameter_names(ours) == expected
    assert not any("norm" in n or "bias" in n for n in expected) and "lm_head.weight" in expected
