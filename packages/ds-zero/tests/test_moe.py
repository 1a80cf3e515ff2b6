"""``ds_zero.moe.utils`` side by side with ``deepspeed.moe.utils`` (DeepSpeedExamples' cifar script imports
``split_params_into_different_moe_groups_for_optimizer``): the same groups from the same parameters, expert
parameters marked as DeepSpeed's MoE layer marks them (``allreduce = False``, ``group_name``)."""

import pytest
import torch

pytest.importorskip("deepspeed")


def _params():
    torch.manual_seed(0)
    shared = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(2)]
    experts = [torch.nn.Parameter(torch.randn(n)) for n in (6, 5, 3)]
    for p, name in zip(experts, ("ep_size_2", "ep_size_2", "ep_size_4")):
        p.allreduce, p.group_name = False, name
    return shared, experts


def _layout(groups, ids):
    return sorted(
        (g["name"], g.get("moe", False), g["lr"], tuple(ids[id(p)] for p in g["params"])) for g in groups
    )


@pytest.mark.parametrize("max_group_size", [178956971, 8, None])
@pytest.mark.parametrize("form", ["dict", "list", "tuple"])
def test_moe_param_groups_split_as_deepspeeds(form, max_group_size):
    from deepspeed.moe import utils as theirs
    from ds_zero.moe import utils as ours

    shared, experts = _params()
    ids = {id(p): i for i, p in enumerate(shared + experts)}
    layouts = []
    for impl in (theirs, ours):
        groups = [{"params": shared + experts[:2], "name": "parameters", "lr": 0.1},
                  {"params": experts[2:], "name": "other", "lr": 0.2}]
        arg = {"dict": groups[0], "list": groups, "tuple": tuple(groups)}[form]
        layouts.append(_layout(impl.split_params_into_different_moe_groups_for_optimizer(arg, max_group_size), ids))
        assert impl.split_params_into_shared_and_expert_params(shared + experts) == (shared, experts)
        assert [impl.is_moe_param(p) for p in shared + experts] == [False, False, True, True, True]
    assert layouts[0] == layouts[1] and any(moe for _, moe, _, _ in layouts[0])
    with pytest.raises(ValueError, match="Unknown param group type"):
        ours.split_params_into_different_moe_groups_for_optimizer(shared[0])
