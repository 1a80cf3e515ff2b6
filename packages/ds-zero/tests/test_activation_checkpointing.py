"""Activation checkpointing: DeepSpeed's tests/unit/runtime/activation_checkpointing/test_activation_checkpointing.py
ported (upstream skips them on its CPU accelerator; they run here), then ours: dropout replayed exactly (gradients
equal the plain model's in train mode), the model-parallel RNG tracker, the saved-activation bytes each memory
option leaves (counted with saved-tensor hooks), partition_activations across a model-parallel group of 2, and
ZeRO-3 with checkpointed blocks: torch's result, prefetching on, the trace unchanged by the recompute."""

import importlib.util
import pathlib
from copy import deepcopy

import pytest
import torch
from ds_zero import checkpointing

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

HIDDEN_DIM = 20
ckpt = checkpointing.checkpoint


@pytest.fixture(autouse=True)
def _defaults():
    checkpointing.configure(None, partition_activations=False, contiguous_checkpointing=False, num_checkpoints=None,
                            checkpoint_in_cpu=False)
    yield
    checkpointing.configure(None, partition_activations=False, contiguous_checkpointing=False, num_checkpoints=None,
                            checkpoint_in_cpu=False)


# --- upstream's cases ------------------------------------------------------------------------------------------
def _compute(module, *inputs, do_checkpoint=False):
    outputs = ckpt(module, *inputs) if do_checkpoint else module(*inputs)
    if torch.is_tensor(outputs):
        outputs = (outputs,)
    sum(o.sum() for o in outputs if torch.is_tensor(o) and o.requires_grad).backward()
    return {"outputs": outputs, "module_grads": [p.grad for p in module.parameters()],
            "input_grads": [inp.grad for inp in inputs if torch.is_tensor(inp)]}


def _match_outputs(ref, tgt):
    assert type(ref) is type(tgt)
    if type(ref) in [list, tuple]:
        for x, y in zip(ref, tgt):
            _match_outputs(x, y)
    elif not torch.is_tensor(ref):
        assert ref == tgt
    elif ref.is_floating_point():
        assert torch.allclose(ref, tgt)
    else:
        assert torch.equal(ref, tgt)


def _test_activation_checkpoint(module, *inputs):
    module.eval()
    base = _compute(deepcopy(module), *deepcopy(inputs), do_checkpoint=False)
    test = _compute(deepcopy(module), *deepcopy(inputs), do_checkpoint=True)
    for group in base:
        for b, t in zip(base[group], test[group]):
            _match_outputs(b, t)


class MaskedLinear(torch.nn.Linear):
    def forward(self, x, mask):
        out = super().forward(x)
        return out * mask if mask.is_floating_point() else out * mask.type_as(out)


class MaskedLinearSeq(MaskedLinear):
    def forward(self, x, mask):
        return super().forward(x, mask), mask


class MaskedLinearSeqDup(MaskedLinearSeq):
    def forward(self, x, mask):
        dup = x.clone().detach() * 1.38
        x, mask = super().forward(x, mask)
        return dup, x, mask


class DropMaskLinear(torch.nn.Linear):
    def forward(self, x, mask):
        return super().forward(x)


class LinearNonTensorInput(torch.nn.Linear):
    def forward(self, x, non_tensor_input):
        return super().forward(x)


class LinearNonTensorOutput(torch.nn.Linear):
    def __init__(self, non_tensor_output):
        super().__init__(HIDDEN_DIM, HIDDEN_DIM)
        self.non_tensor_output = non_tensor_output

    def forward(self, x):
        return super().forward(x), self.non_tensor_output


def _mixed_mask(size=HIDDEN_DIM):
    return torch.where(torch.randn(size) > 0, torch.ones(size), torch.zeros(size)).bool()


def _inputs():
    x = torch.rand(HIDDEN_DIM)
    x.requires_grad = True
    return x


@pytest.mark.parametrize("mask", [_mixed_mask(), _mixed_mask().float()], ids=["bool", "float"])
@pytest.mark.parametrize("case", ["inputs1_outputs1", "inputs2_outputs1", "inputs2_outputs2", "inputs2_outputs3",
                                  "arg_none"])
def test_activation_checkpoint(mask, case):
    if case == "inputs1_outputs1":
        _test_activation_checkpoint(torch.nn.Linear(HIDDEN_DIM, HIDDEN_DIM), _inputs())
    elif case == "arg_none":
        _test_activation_checkpoint(DropMaskLinear(HIDDEN_DIM, HIDDEN_DIM), _inputs(), None)
    else:
        cls = {"inputs2_outputs1": MaskedLinear, "inputs2_outputs2": MaskedLinearSeq,
               "inputs2_outputs3": MaskedLinearSeqDup}[case]
        _test_activation_checkpoint(cls(HIDDEN_DIM, HIDDEN_DIM), _inputs(), mask)


@pytest.mark.parametrize("non_tensor", [None, 2, True, (None, 2.5), (None, True, torch.randn(HIDDEN_DIM))])
def test_ckpt_non_tensor_input_and_output(non_tensor):
    _test_activation_checkpoint(LinearNonTensorInput(HIDDEN_DIM, HIDDEN_DIM), _inputs(), non_tensor)
    _test_activation_checkpoint(LinearNonTensorOutput(non_tensor), _inputs())


@pytest.mark.parametrize("non_tensor_output", [None, (torch.randn(HIDDEN_DIM), 2.5),
                                               (None, torch.randn(HIDDEN_DIM), True),
                                               (None, True, torch.randn(HIDDEN_DIM))])
def test_ckpt_non_tensor_output_ordering(non_tensor_output):
    module = LinearNonTensorOutput(non_tensor_output)
    outputs = _compute(module, _inputs(), do_checkpoint=True)["outputs"]
    ordering = [torch.is_tensor(t) for item in outputs
                for t in (item if type(item) in (list, tuple) else [item])]
    expected = [True] + ([torch.is_tensor(t) for t in non_tensor_output] if type(non_tensor_output) is tuple
                         else [torch.is_tensor(non_tensor_output)])
    assert ordering == expected


def test_tensor_and_non_tensor_keyword_arguments():
    def function(value, *, scale, offset):
        return value * scale + offset

    value = torch.randn(HIDDEN_DIM, requires_grad=True)
    scale = torch.randn(HIDDEN_DIM, requires_grad=True)
    ref_value, ref_scale = value.detach().clone().requires_grad_(), scale.detach().clone().requires_grad_()
    reference = function(ref_value, scale=ref_scale, offset=1.5)
    reference.sum().backward()
    output = ckpt(function, value, scale=scale, offset=1.5)
    output.sum().backward()
    torch.testing.assert_close(output, reference)
    torch.testing.assert_close(value.grad, ref_value.grad)
    torch.testing.assert_close(scale.grad, ref_scale.grad)


def test_configure_with_contiguous_checkpointing_requires_num_checkpoints():
    with pytest.raises(ValueError, match="number_checkpoints"):
        checkpointing.configure(None, contiguous_checkpointing=True, num_checkpoints=None)


# --- ours ------------------------------------------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self, dim=32, p=0.3):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x, extras=None):
        return {"h": x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(x)))), "extras": [extras]}


def _run_blocks(blocks, x, do_checkpoint, seed=7):
    torch.manual_seed(seed)
    h = x
    for b in blocks:
        h = (ckpt(b, h) if do_checkpoint else b(h))["h"]
    return h


def _saved(fn):
    """Bytes and tensors autograd saved for backward while ``fn`` ran (saved-tensor hooks)."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    seen = {}
    for t in saved:
        seen[(t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())] = t
    return out, sum(t.numel() * t.element_size() for t in seen.values()), list(seen.values())


def test_dropout_replayed_exactly_and_outputs_in_dicts():
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([Block() for _ in range(3)]).train()
    ref = deepcopy(blocks)
    x = torch.randn(16, 32)
    out_ref = _run_blocks(ref, x.clone().requires_grad_(), False)
    out_ref.sum().backward()
    xc = x.clone().requires_grad_()
    out = _run_blocks(blocks, xc, True)
    out.sum().backward()
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
    for p, q in zip(blocks.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)  # same masks in the replay
    # without restoring the RNG the replay would draw new masks: prove the test can see that
    state = torch.get_rng_state()
    a = Block()(x)["h"]
    b = Block()(x)["h"]
    torch.set_rng_state(state)
    assert not torch.equal(a, b)


class _TensorParallelRank1:
    """The part of an mpu that seeding reads: tensor-parallel rank 1 of 2, data-parallel rank 0."""

    def get_tensor_model_parallel_rank(self):
        return 1

    def get_data_parallel_rank(self):
        return 0

    def get_tensor_model_parallel_world_size(self):
        return 2

    def get_tensor_model_parallel_group(self):
        return None  # read by DeepSpeed's configure, used only when activations are partitioned


@pytest.fixture
def mpu_configured():
    checkpointing.configure(_TensorParallelRank1())
    yield
    checkpointing.configure(None)


def test_rng_tracker_forks_a_separate_stream_and_checkpoint_replays_it(mpu_configured):
    checkpointing.model_parallel_cuda_manual_seed(1234)
    assert torch.equal(checkpointing.get_cuda_rng_tracker().get_states()["model-parallel-rng"],
                       torch.manual_seed(1234 + 2718 + 1).get_state())  # the mpu's tensor-parallel rank
    checkpointing.model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(3)
    tracker = checkpointing.get_cuda_rng_tracker()
    before = torch.get_rng_state()
    with tracker.fork():
        forked = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)  # the default stream did not move
    with pytest.raises(ValueError, match="already exists"):
        tracker.add("model-parallel-rng", 1)

    def region(x):
        with tracker.fork():
            return torch.nn.functional.dropout(x, 0.5, training=True)

    checkpointing.model_parallel_cuda_manual_seed(99)
    x = torch.ones(64, requires_grad=True)
    ref = region(x.detach().clone().requires_grad_())
    checkpointing.model_parallel_cuda_manual_seed(99)
    checkpointing.configure(None)  # the checkpoint itself runs without model parallelism
    out = ckpt(region, x)
    out.sum().backward()
    assert torch.equal(out, ref) and torch.equal(x.grad, (ref != 0).float() * 2)
    assert not torch.equal(forked, torch.rand(4))


def _seeding_side_by_side(rank, world):
    """DeepSpeed's and ds_zero's ``checkpointing`` seeded the same way: without an mpu, then with one."""
    import deepspeed
    import ds_zero.checkpointing as ours

    theirs = deepspeed.checkpointing  # an attribute of deepspeed, not a module path
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # plain gloo, no C++ build
    deepspeed.init_distributed()  # its configure asks its own comm layer for the rank

    out = {}
    for name, lib_ in (("deepspeed", theirs), ("ds_zero", ours)):
        lib_.configure(None)
        torch.manual_seed(7)
        try:
            lib_.model_parallel_cuda_manual_seed(1234)
            out[(name, "no mpu")] = "seeded"
        except AttributeError:
            out[(name, "no mpu")] = ("AttributeError", torch.equal(torch.get_rng_state(),
                                                                    torch.manual_seed(7).get_state()))
        lib_.configure(_TensorParallelRank1())
        lib_.model_parallel_cuda_manual_seed(1234)
        tracker = lib_.get_cuda_rng_tracker()
        assert isinstance(tracker, lib_.CudaRNGStatesTracker)
        with tracker.fork():
            drawn = torch.rand(3)
        states = tracker.get_states()
        out[(name, "mpu")] = (torch.rand(3), drawn, states["model-parallel-rng"], states is not tracker.states_)
        tracker.set_states(states)
        out[(name, "set_states keeps the dict")] = tracker.states_ is states
        lib_.configure(None)
    return out


def test_model_parallel_seeding_and_rng_tracker_as_deepspeeds():
    """DeepSpeed's activation-checkpointing page: ``CudaRNGStatesTracker`` at ``deepspeed.checkpointing``, and
    ``model_parallel_cuda_manual_seed(seed)`` reading the configured mpu. Without one, DeepSpeed's rank 0 fails
    (AttributeError) and its other ranks reseed; ds_zero fails on every rank, leaving the generator untouched."""
    pytest.importorskip("deepspeed")
    results = run_ranks(_seeding_side_by_side, 2, timeout=240, fresh=True)
    assert results[0][("deepspeed", "no mpu")][0] == "AttributeError"
    assert results[1][("deepspeed", "no mpu")] == "seeded"
    for r in results:
        assert r[("ds_zero", "no mpu")] == ("AttributeError", True)
        for a, b in zip(r[("deepspeed", "mpu")], r[("ds_zero", "mpu")]):
            assert torch.equal(a, b) if torch.is_tensor(a) else a == b
        assert r[("deepspeed", "set_states keeps the dict")] and r[("ds_zero", "set_states keeps the dict")]


def test_saved_activation_bytes_per_memory_option():
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([Block(p=0.0) for _ in range(4)])
    x = torch.randn(16, 32, requires_grad=True)
    one_input = 16 * 32 * 4
    _, plain, _ = _saved(lambda: _run_blocks(blocks, x, False))
    out, kept, _ = _saved(lambda: _run_blocks(blocks, x, True))
    out.sum().backward()
    assert plain > 8 * 4 * one_input  # every block saves its fc1/gelu/fc2 activations
    assert kept == 4 * one_input  # only each block's input
    checkpointing.configure(None, checkpoint_in_cpu=True)
    pool = checkpointing.host_pool()
    out, kept_cpu, tensors = _saved(lambda: _run_blocks(blocks, x, True))
    # the inputs went to the host pool (on a GPU machine: pinned host memory instead of device memory)
    assert kept_cpu == 4 * one_input and all(pool.holds(t) for t in tensors)
    assert pool.nbytes() == 4 * one_input
    grads_cpu = torch.autograd.grad(out.sum(), [x])[0]
    checkpointing.configure(None, checkpoint_in_cpu=False, contiguous_checkpointing=True, num_checkpoints=4,
                            partition_activations=True)
    out, _, tensors = _saved(lambda: _run_blocks(blocks, x, True))
    slots = checkpointing.checkpointing._STATE.slot_buffers
    assert len(slots) == 4 and all(any(t.data_ptr() == s.data_ptr() for s in slots) for t in tensors)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), [x])[0], grads_cpu, rtol=0, atol=0)
    checkpointing.configure(None, contiguous_checkpointing=True, num_checkpoints=3)
    with pytest.raises(RuntimeError, match="number_checkpoints=3"):
        _run_blocks(blocks, x, True)


class _MPGroup:
    def __init__(self):
        import torch.distributed as dist

        self.group = dist.new_group([0, 1])

    def get_model_parallel_group(self):
        return self.group

    def get_model_parallel_rank(self):
        import torch.distributed as dist

        return dist.get_rank(self.group)

    def get_model_parallel_world_size(self):
        return 2


def _distributed_cases(rank, world):
    with lib.one_thread():
        return _distributed_cases_body(rank, world)


def _distributed_cases_body(rank, world):
    import ds_zero
    from ds_zero.runtime.zero import partition_parameters as pp

    out = {}
    # partition_activations: the two ranks hold the same activations (a tensor-parallel group); each keeps half.
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([Block(p=0.0) for _ in range(2)])
    x = torch.randn(16, 32, requires_grad=True)
    ref_grads = torch.autograd.grad(_run_blocks(deepcopy(blocks), x, False).sum(), [x])[0]
    checkpointing.configure(_MPGroup(), partition_activations=True)
    y, kept, _ = _saved(lambda: _run_blocks(blocks, x, True))
    out["partition"] = (kept, torch.equal(torch.autograd.grad(y.sum(), [x])[0], ref_grads))
    checkpointing.configure(None, partition_activations=False)

    # ZeRO-3 with every block checkpointed: like torch, prefetching, and the same forward trace as without.
    for do_ckpt in (False, True):
        torch.manual_seed(0)
        model = Net(do_ckpt)
        cfg = lib.base_config(3, world, micro=2)
        cfg["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size=10_000)
        engine, *_ = ds_zero.initialize(model=model, config=cfg)
        gathers = {"async": 0}
        real = pp.AllGatherHandle.__init__

        def counting(self, params, group, async_op, real=real, gathers=gathers):
            gathers["async"] += int(async_op)
            real(self, params, group, async_op)

        pp.AllGatherHandle.__init__ = counting
        try:
            g = torch.Generator().manual_seed(5)
            xs = torch.randn(4, 2 * world, 32, generator=g)
            losses = []
            for s in range(4):
                loss = engine(xs[s, rank * 2:(rank + 1) * 2]).pow(2).mean()
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
        finally:
            pp.AllGatherHandle.__init__ = real
        coord = engine.optimizer.coordinator
        names = {id(m): n for n, m in engine.module.named_modules()}
        out[("zero3", do_ckpt)] = dict(losses=losses, params=lib.full_params(engine), gathers=gathers["async"],
                                       trace=[names[id(m)] for m in coord.trace["fwd"]])
        engine.destroy()
    return out


class Net(torch.nn.Module):
    def __init__(self, do_ckpt):
        super().__init__()
        # reentrant checkpointing differentiates through its inputs: the first block's must require grad
        self.embed = torch.nn.Linear(32, 32)
        self.blocks = torch.nn.ModuleList([Block(p=0.0) for _ in range(3)])
        self.head = torch.nn.Linear(32, 4)
        self.do_ckpt = do_ckpt

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = (ckpt(b, x) if self.do_ckpt else b(x))["h"]
        return self.head(x)


def test_partitioned_activations_and_zero3_with_checkpointing():
    results = run_ranks(_distributed_cases, 2, timeout=240)
    one_input = 16 * 32 * 4
    for r in results:
        kept, grads_equal = r["partition"]
        assert grads_equal
        assert kept == 2 * one_input // 2  # two checkpoints, half of each input per rank
    torch.manual_seed(0)
    ref = Net(False)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    g = torch.Generator().manual_seed(5)
    xs = torch.randn(4, 4, 32, generator=g)
    ref_losses = []
    for s in range(4):
        opt.zero_grad()
        loss = (ref(xs[s, :2]).pow(2).mean() + ref(xs[s, 2:]).pow(2).mean()) / 2
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    plain, ckpted = results[0][("zero3", False)], results[0][("zero3", True)]
    assert lib.mean_over_ranks([r[("zero3", True)]["losses"] for r in results]) == pytest.approx(ref_losses, rel=1e-5)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(ckpted["params"][name], p.detach(), rtol=1e-4, atol=1e-6, msg=name)
    assert ckpted["trace"] == plain["trace"] and len(plain["trace"]) > 4  # the replay added nothing to the trace
    assert ckpted["gathers"] > 0 and plain["gathers"] > 0  # prefetching follows the trace in both
