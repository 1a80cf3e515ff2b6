"""``DeepSpeedCPUAdam`` against torch's Adam/AdamW: DeepSpeed's tests/unit/ops/adam/test_cpu_adam.py
(``test_torch_adamw_equal`` over its model sizes and dtypes) ported, then stricter checks of our own: element
by element over many steps, both the C++ kernel and the pure-torch path, Adam (L2) and AdamW (decoupled)
weight decay, no bias correction, and the fused low-precision copy-out."""

import pytest
import torch
from ds_zero.ops import CPUAdam, CPUAdamW, DeepSpeedCPUAdam
from ds_zero.ops.op_builder import CPUAdamBuilder, OpBuildError


def _kernel_available() -> bool:
    try:
        CPUAdamBuilder().load()
        return True
    except OpBuildError:
        return False


KERNEL = pytest.param(True, id="kernel", marks=pytest.mark.skipif(not _kernel_available(),
                                                                  reason="no C++ compiler: kernel not built"))
PATHS = [KERNEL, pytest.param(False, id="torch")]


def _compare_optimizers(model_size, param1, optimizer1, param2, optimizer2):
    for _ in range(10):
        param1.grad = torch.randn(model_size, device=param1.device).to(param1.dtype)
        param2.grad = param1.grad.clone().detach().to(device=param2.device, dtype=param2.dtype)
        optimizer1.step()
        optimizer2.step()
    tolerance = param1.float().norm().detach().item() * 1e-2
    assert param1.float().norm().item() == pytest.approx(param2.float().norm().item(), abs=tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float], ids=["bf16", "fp32"])  # fp16: CUDA-only upstream
@pytest.mark.parametrize("model_size", [64, 22, 128, 1024, 1048576])
def test_torch_adamw_equal(dtype, model_size):
    """Upstream's test, as it is: norms after 10 steps agree within 1%."""
    cpu_data = torch.randn(model_size, device="cpu").to(dtype)
    cpu_param = torch.nn.Parameter(cpu_data)
    ref_param = torch.nn.Parameter(cpu_data.clone())
    _compare_optimizers(model_size, cpu_param, DeepSpeedCPUAdam([cpu_param]), ref_param,
                        torch.optim.AdamW([ref_param]))


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), [
    (CPUAdamW, torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.05)),
    (CPUAdam, torch.optim.Adam, dict(lr=3e-3, weight_decay=0.05)),
    (CPUAdamW, torch.optim.AdamW, dict(lr=1e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0)),
], ids=["adamw", "adam-l2", "adamw-betas"])
def test_matches_torch_elementwise_over_many_steps(use_kernel, ours, theirs, kwargs):
    torch.manual_seed(0)
    n = 4099  # not a multiple of the vector width or of a tile
    init = [torch.randn(n), torch.randn(7, 13)]
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    opt_a = ours(a, use_kernel=use_kernel, **kwargs)
    opt_b = theirs(b, **kwargs)
    assert opt_a.uses_kernel == use_kernel
    for _ in range(300):
        for pa, pb in zip(a, b):
            pa.grad = torch.randn_like(pa)
            pb.grad = pa.grad.clone()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(a, b):
        # The C++ kernel's sqrt is IEEE; torch's vectorised sqrt (MKL) is not always correctly rounded, so the
        # two differ by an ulp now and then. The torch path performs torch's exact operations: bitwise equal.
        tol = dict(rtol=1e-5, atol=1e-6) if use_kernel else dict(rtol=0, atol=0)
        torch.testing.assert_close(pa.detach(), pb.detach(), **tol)
        torch.testing.assert_close(opt_a.state[pa]["exp_avg_sq"], opt_b.state[pb]["exp_avg_sq"], **tol)
    assert (a[0].detach() - init[0]).abs().max() > 0.03  # 300 steps moved the weights


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_low_precision_copy_out(use_kernel, dtype):
    """``step(fp16_param_groups=...)`` writes the rounded update in the same pass (ZeRO-Offload's copy-back)."""
    torch.manual_seed(1)
    master = torch.nn.Parameter(torch.randn(70_001))
    out = torch.empty(70_001, dtype=dtype)
    opt = DeepSpeedCPUAdam([master], lr=1e-2, use_kernel=use_kernel)
    for _ in range(3):
        master.grad = torch.randn_like(master)
        opt.step(fp16_param_groups=[out])
        assert torch.equal(out, master.detach().to(dtype))


def test_no_bias_correction_and_errors():
    p = torch.nn.Parameter(torch.ones(5))
    opt = DeepSpeedCPUAdam([p], lr=0.1, bias_correction=False, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0)
    p.grad = torch.full((5,), 2.0)
    opt.step()
    # m = 0.2, v = 0.004; without bias correction the step is lr * m / sqrt(v)
    torch.testing.assert_close(p.detach(), torch.full((5,), 1 - 0.1 * 0.2 / 0.004 ** 0.5))
    with pytest.raises(ValueError, match="amsgrad"):
        DeepSpeedCPUAdam([p], amsgrad=True)
    if torch.cuda.is_available():
        q = torch.nn.Parameter(torch.ones(3, device="cuda"))
        q.grad = torch.ones_like(q)
        with pytest.raises(RuntimeError, match="must be on the CPU"):
            DeepSpeedCPUAdam([q]).step()


def test_disabled_build_falls_back_to_torch(monkeypatch, caplog):
    from ds_zero.ops.adam import cpu_adam

    monkeypatch.setenv("DS_ZERO_BUILD_OPS", "0")
    monkeypatch.setattr(cpu_adam, "_fallback_logged", False)
    monkeypatch.setattr(CPUAdamBuilder, "_loaded", {})
    with pytest.raises(OpBuildError, match="DS_ZERO_BUILD_OPS=0"):
        CPUAdamBuilder().load()
    opt = DeepSpeedCPUAdam([torch.nn.Parameter(torch.ones(3))])
    assert not opt.uses_kernel and "pure-torch path" in caplog.text
