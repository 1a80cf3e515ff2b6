// Fused Adam / AdamW step on CPU (DeepSpeed's csrc/adam/cpu_adam_impl.cpp, Adam_Optimizer::Step_AVX).
// One pass over memory per element: decay, both moments, the update and, optionally, the rounded
// low-precision copy the model trains with. Tiles run on ATen's intra-op threads; the inner loop is
// plain scalar code the compiler vectorises (-O3 -march=native), in the same operation order as
// torch.optim.AdamW's single-tensor path so results agree to fp32 rounding.
// Registered as torch.ops.ds_zero.adam_update (TORCH_LIBRARY, no pybind): the light headers build in seconds.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#include <cmath>
#include <optional>

namespace {

constexpr int64_t kTile = 1 << 16;  // elements per task: big enough to amortise scheduling, fits L2

struct Hyper {
  // 1 - beta in double then rounded, as torch passes its Python-float weights; 1.0f - 0.9f is not 0.1f.
  float one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bias_correction2_sqrt;
  bool adamw;
};

template <typename Out>
void step_range(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                Out* __restrict out, int64_t begin, int64_t end, const Hyper h) {
  const float one_minus_beta1 = h.one_minus_beta1;
  const float one_minus_beta2 = h.one_minus_beta2;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float grad = g[i];
    float param = p[i];
    if (h.adamw) {
      param = param * h.decay;  // decay = 1 - lr * weight_decay
    } else {
      grad = grad + param * h.decay;  // decay = weight_decay (L2 into the gradient)
    }
    // torch's vectorised lerp for weight < 0.5 is one fused multiply-add
    const float mi = std::fma(one_minus_beta1, grad - m[i], m[i]);
    const float vi = std::fma(one_minus_beta2 * grad, grad, v[i] * h.beta2);  // torch's addcmul, fused
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / h.bias_correction2_sqrt + h.eps;
    param = param + (-h.step_size) * mi / denom;
    p[i] = param;
  }
  if (out != nullptr) {
    for (int64_t i = begin; i < end; ++i) out[i] = static_cast<Out>(p[i]);
  }
}

template <typename Out>
void run(at::Tensor& params, const at::Tensor& grads, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
         Out* out, const Hyper& h) {
  float* p = params.data_ptr<float>();
  const float* g = grads.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  at::parallel_for(0, params.numel(), kTile, [&](int64_t begin, int64_t end) {
    step_range<Out>(p, g, m, v, out, begin, end, h);
  });
}

void check(const at::Tensor& t, const char* name, int64_t numel) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.numel() == numel, name, " has ", t.numel(), " elements, expected ", numel);
}

}  // namespace

// lr, betas, eps and the bias corrections come precomputed from Python (in double, as torch does).
void adam_update(at::Tensor params, at::Tensor grads, at::Tensor exp_avg, at::Tensor exp_avg_sq,
                 double lr, double beta1, double beta2, double eps, double decay, double step_size,
                 double bias_correction2_sqrt, bool adamw_mode, const std::optional<at::Tensor>& low_precision_out) {
  const int64_t n = params.numel();
  for (auto* t : {&params, &grads, &exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, "CPUAdam tensors must be float32");
  }
  check(params, "params", n);
  check(grads, "grads", n);
  check(exp_avg, "exp_avg", n);
  check(exp_avg_sq, "exp_avg_sq", n);
  const Hyper h{static_cast<float>(1.0 - beta1), static_cast<float>(beta2), static_cast<float>(1.0 - beta2),
                static_cast<float>(eps), static_cast<float>(decay), static_cast<float>(step_size),
                static_cast<float>(bias_correction2_sqrt), adamw_mode};
  if (!low_precision_out.has_value()) {
    run<float>(params, grads, exp_avg, exp_avg_sq, nullptr, h);
    return;
  }
  at::Tensor out = *low_precision_out;  // NOLINT: a handle to the caller's tensor, written in place
  check(out, "low_precision_out", n);
  switch (out.scalar_type()) {
    case at::kBFloat16:
      run<c10::BFloat16>(params, grads, exp_avg, exp_avg_sq, out.data_ptr<c10::BFloat16>(), h);
      break;
    case at::kHalf:
      run<c10::Half>(params, grads, exp_avg, exp_avg_sq, out.data_ptr<c10::Half>(), h);
      break;
    case at::kFloat:
      run<float>(params, grads, exp_avg, exp_avg_sq, out.data_ptr<float>(), h);
      break;
    default:
      TORCH_CHECK(false, "low_precision_out must be bfloat16, float16 or float32");
  }
}

TORCH_LIBRARY(ds_zero, m) {
  m.def("adam_update(Tensor(a!) params, Tensor grads, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, float lr, "
        "float beta1, float beta2, float eps, float decay, float step_size, float bias_correction2_sqrt, "
        "bool adamw_mode, Tensor(d!)? low_precision_out) -> ()",
        &adam_update);
}
