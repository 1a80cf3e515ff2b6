"""``zero.Init`` / ``GatheredParameters`` and ZeRO-3 module outputs, ported from DeepSpeed's
tests/unit/runtime/zero/test_zero_context.py, test_zero_context_return.py and test_zero_nesting_init.py
(rewritten against ds_zero), plus what they leave out: a parent's ``self.apply(init_fn)`` (Hugging Face's
``post_init``), a subclass adjusting ``super().__init__``'s weights, ``torch.nn.utils.skip_init``, and
modules returning lists/dicts/their own parameter trained against plain torch."""

import importlib.util
import os
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

DIM = 8


class ConvX(torch.nn.Conv1d):
    def __init__(self, *args):
        super().__init__(*args)
        self.param_in = torch.nn.Parameter(torch.FloatTensor(5).uniform_())  # after super().__init__


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = ConvX(1, 3, 4)
        self.param = torch.nn.Parameter(torch.FloatTensor(5).uniform_())


class PostInit(torch.nn.Module):
    """Hugging Face's pattern: children first, then one ``self.apply(self._init_weights)`` at the end."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(DIM, DIM)
        self.b = torch.nn.Linear(DIM, DIM)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, torch.nn.Linear):
            m.weight.data.fill_(0.5)
            m.bias.data.zero_()


class ZeroedLinear(torch.nn.Linear):
    """A subclass that adjusts what ``super().__init__`` built (DeepSpeed partitions after the outermost init)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.weight.data.mul_(0.0)


class ListOut(torch.nn.Linear):
    def forward(self, x):
        h = super().forward(x)
        return [h, torch.tanh(h)]


class DictOut(torch.nn.Linear):
    def forward(self, x):
        h = super().forward(x)
        return {"h": h, "nested": (h * 2,)}


class DanglingBias(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x), self.bias  # returns its own parameter (DeepSpeed's "external parameter")


class OutputsNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = ListOut(DIM, DIM)
        self.second = DictOut(DIM, DIM)
        self.dangler = DanglingBias(DIM, DIM)

    def forward(self, x):
        a, b = self.first(x)
        d = self.second(a + b)
        out, bias = self.dangler(d["h"] + d["nested"][0])
        return {"loss": ((out + bias) ** 2).mean()}


def _context_cases(rank, world):
    with lib.one_thread():
        return _context_cases_body(rank, world)


def _context_cases_body(rank, world):
    import ds_zero
    import torch.distributed as dist
    from ds_zero.zero import GatheredParameters, Init, ZeroParamStatus

    out = {}
    # TestSerialContext.test_subclass_param
    with Init(dtype=torch.float32):
        net = ConvNet()
    out["subclass_param"] = (net.param.ds_status == ZeroParamStatus.NOT_AVAILABLE
                             and net.conv1.param_in.ds_status == ZeroParamStatus.NOT_AVAILABLE)
    # TestScatterGather: partitioned inside, untouched outside the context
    with Init(dtype=torch.float32):
        lin = torch.nn.Linear(6, 3)
    plain = torch.nn.Linear(6, 3)
    scattered = lin.weight.ds_status == ZeroParamStatus.NOT_AVAILABLE and lin.weight.numel() == 0
    with GatheredParameters(lin.weight):
        gathered = lin.weight.ds_status == ZeroParamStatus.AVAILABLE and lin.weight.numel() == 18
    out["scatter_gather"] = (scattered, gathered, not hasattr(plain.weight, "ds_status"), lin.weight.numel() == 0)
    # TestGatherUpdate: modifier rank 1's change is everyone's
    with Init(dtype=torch.float32):
        lin = torch.nn.Linear(4, 2)
    with GatheredParameters(lin.weight, modifier_rank=1):
        if dist.get_rank() == 1:
            with torch.no_grad():
                lin.weight.zero_()
    with GatheredParameters(lin.weight):
        out["gather_update"] = torch.equal(lin.weight, torch.zeros_like(lin.weight))
    # TestNestingInit: nested contexts partition once
    with Init(dtype=torch.float32), Init(dtype=torch.float32):
        nested = torch.nn.Linear(4, 4)
    out["nested"] = hasattr(nested.weight, "ds_id") and nested.weight.ds_tensor.numel() == 8

    # apply() from a parent, a subclass's own adjustment, skip_init.
    with Init(dtype=torch.float32):
        torch.manual_seed(rank)
        post = PostInit()
        zeroed = ZeroedLinear(DIM, DIM)
        skipped = torch.nn.utils.skip_init(torch.nn.Linear, DIM, DIM)
    with GatheredParameters(list(post.parameters()) + list(zeroed.parameters())):
        out["post_init"] = (post.a.weight.detach().clone(), post.b.bias.detach().clone(),
                            zeroed.weight.detach().clone())
    out["skip_init"] = (hasattr(skipped.weight, "ds_id"), skipped.weight.numel(), skipped.weight.ds_numel,
                        skipped.weight.ds_tensor.numel())

    # Outputs in lists and dicts, and a returned parameter, trained with ZeRO-3 against torch.
    cfg = lib.base_config(3, world, micro=2)
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 1
    torch.manual_seed(0)
    engine, *_ = ds_zero.initialize(model=OutputsNet(), config=cfg)
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(3, 2 * world, DIM, generator=g)
    losses = []
    for s in range(3):
        loss = engine(xs[s, rank * 2:(rank + 1) * 2])["loss"]
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    out["outputs"] = (losses, lib.full_params(engine))
    engine.destroy()
    return out


def test_zero_init_gathered_parameters_and_module_outputs():
    """One harness call feeds all checks (a shared fixture would rerun per xdist worker)."""
    results = run_ranks(_context_cases, 2, timeout=240)
    _check_deepspeed_context_cases(results)
    _check_apply_subclass_and_skip_init_under_init(results)
    _check_list_dict_and_returned_param_outputs_train_like_torch(results)



def _check_deepspeed_context_cases(results):
    for r in results:
        assert r["subclass_param"]
        assert r["scatter_gather"] == (True, True, True, True)
        assert r["gather_update"]
        assert r["nested"]


def _check_apply_subclass_and_skip_init_under_init(results):
    for r in results:
        a_weight, b_bias, zeroed = r["post_init"]
        assert torch.equal(a_weight, torch.full((DIM, DIM), 0.5)) and torch.equal(b_bias, torch.zeros(DIM))
        assert torch.equal(zeroed, torch.zeros(DIM, DIM))
        # a partitioned parameter (DIM*DIM elements, half per rank), not a 0-element plain one
        assert r["skip_init"] == (True, 0, DIM * DIM, DIM * DIM // 2)


def _check_list_dict_and_returned_param_outputs_train_like_torch(results):
    torch.manual_seed(0)
    ref = OutputsNet()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(3, 4, DIM, generator=g)
    ref_losses = []
    for s in range(3):
        opt.zero_grad()
        # each rank's loss is the mean over its half, so the global loss is the mean of the halves' losses
        loss = (ref(xs[s, :2])["loss"] + ref(xs[s, 2:])["loss"]) / 2
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    assert lib.mean_over_ranks([r["outputs"][0] for r in results]) == pytest.approx(ref_losses, rel=1e-5)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(results[0]["outputs"][1][name], p.detach(), rtol=1e-4, atol=1e-6, msg=name)



INIT_DTYPES = """
import os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
import deepspeed, ds_zero
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # plain gloo: its shm all-reduce is a C++ build
for impl in (deepspeed, ds_zero):
    with impl.zero.Init():
        default = torch.nn.Linear(4, 4)
    with impl.zero.Init(config_dict_or_path={"train_batch_size": 1, "bf16": {"enabled": False}}):
        fp32 = torch.nn.Linear(4, 4)
    print("DTYPES", impl.__name__, default.weight.ds_tensor.dtype, fp32.weight.ds_tensor.dtype)
"""


def test_zero_init_builds_in_deepspeeds_default_dtype():
    """DeepSpeed's Init._set_dtype: without a config or dtype the model is built in half precision (on the CPU fp16
    where oneDNN has fp16 kernels, as on AVX512-FP16 parts, else bf16); a config's fp16/bf16 sections decide when
    one is given. DeepSpeed's own Init side by side, in a process of its own: DeepSpeed's Init leaves
    torch.nn.functional.linear replaced after it exits."""
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    proc = subprocess.run([sys.executable, "-c", INIT_DTYPES], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "LOCAL_RANK": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln.split()[1:] for ln in proc.stdout.splitlines() if ln.startswith("DTYPES")]
    from ds_zero.runtime.zero.partition_parameters import default_half_dtype

    half = str(default_half_dtype())
    assert lines == [["deepspeed", half, "torch.float32"], ["ds_zero", half, "torch.float32"]]
