"""Tensor-parallel layers at TP 2 and 4 vs the unsharded torch layers, SP layers, and RNG/checkpoint.

``_all_cases`` runs every case on a 4-rank world (TP=4, then TP=2 x DP=2) inside the package's shared 8-rank
run (conftest.py); each test below asserts one case's result.
"""

import importlib.util
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mega_par import parallel_state as ps
from mega_par import tensor_parallel as tpl
from torch import nn

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

TPS = (4, 2)


def _gather(t, dim):
    """All-gather a TP-sharded tensor along ``dim`` (test-side re-assembly)."""
    parts = [torch.empty_like(t) for _ in range(ps.get_tensor_model_parallel_world_size())]
    dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=dim)


def _shard(t, dim):
    return t.chunk(ps.get_tensor_model_parallel_world_size(), dim=dim)[ps.get_tensor_model_parallel_rank()]


def _column(tp):
    for gather_output in (True, False):
        torch.manual_seed(11)
        ref = nn.Linear(8, 12)
        torch.manual_seed(11)
        layer = tpl.ColumnParallelLinear(8, 12, bias=True, gather_output=gather_output)
        torch.testing.assert_close(layer.weight, _shard(ref.weight, 0), rtol=0, atol=0)  # reproducible init
        with torch.no_grad():
            layer.bias.copy_(_shard(ref.bias, 0))
        x = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(3))
        x_ref, x_par = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_ref = ref(x_ref)
        y, bias = layer(x_par)
        assert bias is None
        expected = y_ref if gather_output else _shard(y_ref, -1)
        torch.testing.assert_close(y, expected)
        grad = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(4))
        y_ref.backward(grad)
        y.backward(grad if gather_output else _shard(grad, -1))
        torch.testing.assert_close(x_par.grad, x_ref.grad)
        torch.testing.assert_close(_gather(layer.weight.grad, 0), ref.weight.grad)
        torch.testing.assert_close(_gather(layer.bias.grad, 0), ref.bias.grad)


def _row(tp):
    for input_is_parallel in (True, False):
        torch.manual_seed(12)
        ref = nn.Linear(16, 6)
        torch.manual_seed(12)
        layer = tpl.RowParallelLinear(16, 6, bias=True, input_is_parallel=input_is_parallel)
        torch.testing.assert_close(layer.weight, _shard(ref.weight, 1), rtol=0, atol=0)
        with torch.no_grad():
            layer.bias.copy_(ref.bias)
        x = torch.randn(4, 2, 16, generator=torch.Generator().manual_seed(5))
        x_ref = x.clone().requires_grad_()
        x_par = (_shard(x, -1) if input_is_parallel else x).clone().requires_grad_()
        y_ref, (y, _) = ref(x_ref), layer(x_par)
        torch.testing.assert_close(y, y_ref)
        grad = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(6))
        y_ref.backward(grad)
        y.backward(grad)
        expected_xg = _shard(x_ref.grad, -1) if input_is_parallel else x_ref.grad
        torch.testing.assert_close(x_par.grad, expected_xg)
        torch.testing.assert_close(_gather(layer.weight.grad, 1), ref.weight.grad)
        torch.testing.assert_close(layer.bias.grad, ref.bias.grad)


def _mlp_column_row(tp):
    """Column (no gather) -> GeLU -> row: the paper's MLP, vs two nn.Linear."""
    torch.manual_seed(1)
    fc1 = nn.Linear(8, 32)
    torch.manual_seed(2)
    fc2 = nn.Linear(32, 8)
    torch.manual_seed(1)
    c = tpl.ColumnParallelLinear(8, 32)
    torch.manual_seed(2)
    r = tpl.RowParallelLinear(32, 8, input_is_parallel=True)
    with torch.no_grad():
        c.bias.copy_(_shard(fc1.bias, 0))
        r.bias.copy_(fc2.bias)
    x = torch.randn(6, 2, 8, generator=torch.Generator().manual_seed(2))
    xr, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr = fc2(F.gelu(fc1(xr)))
    yp, _ = r(F.gelu(c(xp)[0]))
    torch.testing.assert_close(yp, yr)
    yr.square().sum().backward()
    yp.square().sum().backward()
    torch.testing.assert_close(xp.grad, xr.grad)
    torch.testing.assert_close(_gather(c.weight.grad, 0), fc1.weight.grad)
    torch.testing.assert_close(_gather(r.weight.grad, 1), fc2.weight.grad)


def _glu_stride(tp):
    """Fused [gate; up] with stride 2: rank r holds [gate_r; up_r] of the full weight."""
    torch.manual_seed(9)
    full = nn.Linear(4, 16, bias=False).weight
    torch.manual_seed(9)
    layer = tpl.ColumnParallelLinear(4, 16, bias=False, stride=2)
    gate, up = full.chunk(2, dim=0)
    torch.testing.assert_close(layer.weight, torch.cat([_shard(gate, 0), _shard(up, 0)]), rtol=0, atol=0)


def _embedding(tp):
    torch.manual_seed(13)
    ref = nn.Embedding(16, 6)
    torch.manual_seed(13)
    emb = tpl.VocabParallelEmbedding(16, 6)
    torch.testing.assert_close(emb.weight, _shard(ref.weight, 0), rtol=0, atol=0)
    ids = torch.randint(0, 16, (3, 7), generator=torch.Generator().manual_seed(1))
    y_ref, y = ref(ids), emb(ids)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    y_ref.backward(g)
    y.backward(g)
    torch.testing.assert_close(_gather(emb.weight.grad, 0), ref.weight.grad)


def _cross_entropy(tp):
    logits = torch.randn(5, 3, 32, generator=torch.Generator().manual_seed(7)) * 4
    target = torch.randint(0, 32, (5, 3), generator=torch.Generator().manual_seed(8))
    for ls in (0.0, 0.1):
        full = logits.clone().requires_grad_()
        ref = F.cross_entropy(full.view(-1, 32), target.view(-1), reduction="none", label_smoothing=ls).view(5, 3)
        part = _shard(logits, -1).clone().requires_grad_()
        loss = tpl.vocab_parallel_cross_entropy(part, target, label_smoothing=ls)
        torch.testing.assert_close(loss, ref)
        w = torch.rand(5, 3, generator=torch.Generator().manual_seed(9))
        (ref * w).sum().backward()
        (loss * w).sum().backward()
        torch.testing.assert_close(part.grad, _shard(full.grad, -1))


def _sequence_parallel_layers(tp):
    """Column(SP): input sharded on the sequence, all-gathered; Row(SP): output reduce-scattered."""
    torch.manual_seed(21)
    fc1 = nn.Linear(8, 16)
    torch.manual_seed(22)
    fc2 = nn.Linear(16, 8)
    torch.manual_seed(21)
    c = tpl.ColumnParallelLinear(8, 16, sequence_parallel=True)
    torch.manual_seed(22)
    r = tpl.RowParallelLinear(16, 8, input_is_parallel=True, sequence_parallel=True)
    with torch.no_grad():
        c.bias.copy_(_shard(fc1.bias, 0))
        r.bias.copy_(fc2.bias)
    x = torch.randn(8, 2, 8, generator=torch.Generator().manual_seed(22))
    xr = x.clone().requires_grad_()
    xp = _shard(x, 0).clone().requires_grad_()
    yr = fc2(torch.relu(fc1(xr)))
    yp, _ = r(torch.relu(c(xp)[0]))
    torch.testing.assert_close(yp, _shard(yr, 0))
    g = torch.randn(yr.shape, generator=torch.Generator().manual_seed(23))
    yr.backward(g)
    yp.backward(_shard(g, 0))
    torch.testing.assert_close(xp.grad, _shard(xr.grad, 0))
    torch.testing.assert_close(_gather(c.weight.grad, 0), fc1.weight.grad)
    torch.testing.assert_close(_gather(r.weight.grad, 1), fc2.weight.grad)
    # the row bias is replicated but sees only this rank's tokens: the all-reduce over TP restores the total
    bias_grad = r.bias.grad.clone()
    dist.all_reduce(bias_grad, group=ps.get_tensor_model_parallel_group())
    torch.testing.assert_close(bias_grad, fc2.bias.grad)
    # the mappings round-trip: scatter then gather is the identity
    torch.testing.assert_close(tpl.gather_from_sequence_parallel_region(tpl.scatter_to_sequence_parallel_region(x),
                                                                        False), x)


def _rng_tracker(tp):
    torch.manual_seed(123)  # the default generator is the caller's to seed (as Megatron's _set_random_seed)
    tpl.model_parallel_cuda_manual_seed(123)
    ones = torch.ones(64)
    outside = F.dropout(ones, 0.5)
    with tpl.get_cuda_rng_tracker().fork():
        inside = F.dropout(ones, 0.5)
    outs, ins = _gather(outside.unsqueeze(0), 0), _gather(inside.unsqueeze(0), 0)
    assert all(torch.equal(outs[0], o) for o in outs), "dropout outside TP regions must match over the TP group"
    assert not torch.equal(ins[0], ins[1]), "dropout inside TP regions must differ per TP rank"
    # checkpoint replays both RNG streams: gradients equal a non-checkpointed run from the same states
    w = torch.randn(64, requires_grad=True)

    def fn(x):
        with tpl.get_cuda_rng_tracker().fork():
            x = F.dropout(x * w, 0.5)
        return F.dropout(x, 0.3)

    torch.manual_seed(5)
    tpl.model_parallel_cuda_manual_seed(5)
    fn(torch.ones(64)).sum().backward()
    plain = w.grad.clone()
    w.grad = None
    torch.manual_seed(5)
    tpl.model_parallel_cuda_manual_seed(5)
    out = tpl.checkpoint(fn, False, torch.ones(64, requires_grad=True))
    F.dropout(torch.ones(3), 0.5)  # advance the RNG between forward and backward
    out.sum().backward()
    torch.testing.assert_close(w.grad, plain, rtol=0, atol=0)
    assert plain.abs().sum() > 0


class _Counter:
    """Wraps torch.distributed collectives and counts calls on one group."""

    NAMES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather")

    def __init__(self, group):
        self.group, self.counts, self.saved = group, dict.fromkeys(self.NAMES, 0), {}

    def __enter__(self):
        for name in self.NAMES:
            orig = self.saved[name] = getattr(dist, name)

            def wrapped(*a, _name=name, _orig=orig, **k):
                if k.get("group") is self.group:
                    self.counts[_name] += 1
                return _orig(*a, **k)

            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(dist, name, fn)


def _comm_counts(tp):
    """Per layer and step: TP = 2 all-reduces forward + 2 backward; SP = 2 all-gathers + 2 reduce-scatters
    each way (plus the all-reduce of the norm/bias grads over TP, done once per step after backward)."""
    from mega_par.models.gpt import get_gpt_layer_local_spec
    from mega_par.transformer import TransformerConfig, TransformerLayer

    for sp in (False, True):
        cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                                hidden_dropout=0.0, attention_dropout=0.0, sequence_parallel=sp,
                                tensor_model_parallel_size=tp)
        tpl.model_parallel_cuda_manual_seed(1)
        layer = TransformerLayer(cfg, get_gpt_layer_local_spec().submodules, 1)
        x = torch.randn(8 // (tp if sp else 1), 2, 16, requires_grad=True)
        with _Counter(ps.get_tensor_model_parallel_group()) as fwd:
            y, _ = layer(x)
        with _Counter(ps.get_tensor_model_parallel_group()) as bwd:
            y.sum().backward()
        if sp:
            want = {"all_reduce": 0, "all_gather_into_tensor": 2, "reduce_scatter_tensor": 2, "all_gather": 0}
        else:
            want = {"all_reduce": 2, "all_gather_into_tensor": 0, "reduce_scatter_tensor": 0, "all_gather": 0}
        # backward swaps the roles: all-gather <-> reduce-scatter, same totals
        assert fwd.counts == want, (sp, fwd.counts)
        assert bwd.counts == want, (sp, bwd.counts)


def _pipeline_state():
    """Live groups at pp=4 (middle stages hold no embedding group) and at tp=2 x pp=2."""
    rank = dist.get_rank()
    ps.initialize_model_parallel(1, 4)
    try:
        assert ps.get_pipeline_model_parallel_rank() == rank
        assert ps.get_pipeline_model_parallel_next_rank() == (rank + 1) % 4
        assert ps.get_pipeline_model_parallel_prev_rank() == (rank - 1) % 4
        assert ps.is_pipeline_first_stage() == (rank == 0) and ps.is_pipeline_last_stage() == (rank == 3)
        assert ps.is_rank_in_embedding_group() == (rank in (0, 3))
        assert ps.get_embedding_group_ranks() == ([0, 3] if rank in (0, 3) else [])
        assert ps.get_data_parallel_world_size() == 1
    finally:
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(2, 2)
    try:
        assert ps.get_tensor_model_parallel_rank() == rank % 2
        assert ps.get_pipeline_model_parallel_rank() == rank // 2
        assert ps.get_data_parallel_world_size() == 1
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=ps.get_pipeline_model_parallel_group())
        assert t.item() == (rank % 2) + (rank % 2 + 2), "pipeline group = same TP rank on both stages"
        try:
            ps.initialize_model_parallel(2, 2)
            raise AssertionError("double initialisation must raise")
        except RuntimeError:
            pass
    finally:
        ps.destroy_model_parallel()
    assert not ps.model_parallel_is_initialized()


def _dtensor_parity():
    """mega_par's TP=2 GPT logits == torch DTensor TP (ColwiseParallel/RowwiseParallel) on the same weights."""
    from mega_par.checkpointing import llama_state_dict
    from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
    from mega_par.transformer import TransformerConfig
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    cfg = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=48,
               hidden_dropout=0.0, attention_dropout=0.0, normalization="RMSNorm", add_bias_linear=False,
               gated_linear_unit=True, activation_func=F.silu)
    kw = dict(vocab_size=64, max_sequence_length=16, position_embedding_type="rope", seed=5)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    ps.initialize_model_parallel(1, 1)
    try:
        full = GPTModel(TransformerConfig(**cfg), get_gpt_layer_local_spec(), **kw).state_dict()
    finally:
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(2, 1)
    try:
        model = GPTModel(TransformerConfig(**cfg), get_gpt_layer_local_spec(), parallel_output=False, **kw).eval()
        with torch.no_grad():
            ours = model(ids, None, None)
    finally:
        ps.destroy_model_parallel()
    plain = H.PlainLlama(llama_state_dict(full, dict(cfg, num_query_groups=2)), 2, 8)
    with torch.no_grad():
        unsharded = plain(ids)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]
    for layer in plain.layers:
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            parallelize_module(layer[name], mesh, ColwiseParallel())
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            parallelize_module(layer[name], mesh, RowwiseParallel())
    with torch.no_grad():
        dtensor = plain(ids)
    assert layer["mlp.down_proj"].weight.to_local().shape == (32, 24), "DTensor must really shard the weights"
    torch.testing.assert_close(dtensor, unsharded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, dtensor, rtol=1e-5, atol=1e-5)


CASES = {"column": _column, "row": _row, "mlp": _mlp_column_row, "glu_stride": _glu_stride,
         "embedding": _embedding, "cross_entropy": _cross_entropy, "sequence_parallel": _sequence_parallel_layers,
         "rng": _rng_tracker, "comm_counts": _comm_counts}


def _all_cases(rank, world_size):
    results = {}
    for tp in TPS:
        ps.initialize_model_parallel(tp, 1)
        try:
            out = H.run_cases({name: (lambda f=f, tp=tp: f(tp)) for name, f in CASES.items()})
            results.update({f"{name}_tp{tp}": v for name, v in out.items()})
        finally:
            ps.destroy_model_parallel()
    results.update(H.run_cases({"dtensor": _dtensor_parity, "pipeline_state": _pipeline_state}))
    # bad input fails before any communication
    try:
        ps.initialize_model_parallel(3, 1)
        results["bad_world"] = (False, "world 4 with tp 3 did not raise")
    except ValueError as e:
        ok = "world size (4)" in str(e) and "(3)" in str(e)
        results["bad_world"] = (ok, str(e))
    return results


@pytest.fixture(scope="module")
def results(mega_par_ranks):
    """The cases ran on ranks 0-3 of the package's shared 8-rank run (conftest.py, test_gpt_3d.ROUNDS)."""
    return [r["layers"] for r in mega_par_ranks["per_rank"][:4]]


@pytest.mark.world_size(4)
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("case", list(CASES))
def test_parallel_layer_matches_unsharded_torch(results, case, tp):
    H.assert_case(results, f"{case}_tp{tp}")


@pytest.mark.world_size(4)
def test_tp2_gpt_logits_match_dtensor_tensor_parallel(results):
    H.assert_case(results, "dtensor")


@pytest.mark.world_size(4)
def test_pipeline_groups_neighbours_and_embedding_group(results):
    H.assert_case(results, "pipeline_state")


@pytest.mark.world_size(4)
def test_world_not_divisible_raises_naming_numbers(results):
    H.assert_case(results, "bad_world")

