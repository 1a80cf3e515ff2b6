"""Shared helpers for mega-par's multi-rank tests."""

import traceback


def run_cases(cases: dict) -> dict:
    """Run named zero-arg callables inside a rank; record (ok, message) per case instead of dying on the first."""
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            out[name] = (True, "")
        except Exception:  # noqa: BLE001 - reported per case to the test process
            out[name] = (False, traceback.format_exc())
    return out


def assert_case(results: list, name: str) -> None:
    """results: per-rank dicts from run_cases; fail naming each rank whose case failed."""
    assert all(name in r for r in results), f"case {name} did not run on every rank"
    bad = {rank: r[name][1] for rank, r in enumerate(results) if not r[name][0]}
    assert not bad, "\n".join(f"rank {k}:\n{v}" for k, v in bad.items())


def job_results(mega_par_ranks: dict, key: str) -> list:
    """Per-rank results stored under ``key`` by the job that ran them (in its rank order)."""
    results = [r[key] for r in mega_par_ranks["per_rank"] if key in r]
    assert results, f"no rank of the shared run reported {key!r}"
    return results


class PlainLlama:
    """An independent, plain-torch Llama forward over Hugging Face tensor names (nn.Linear modules, so
    DTensor's ColwiseParallel/RowwiseParallel can shard it). Heads are inferred from local shapes."""

    def __init__(self, tensors: dict, num_layers: int, head_dim: int, eps: float = 1e-5):
        import torch
        from torch import nn

        def linear(name):
            w = tensors[name]
            lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
            with torch.no_grad():
                lin.weight.copy_(w)
            return lin

        self.layers = []
        for i in range(num_layers):
            p = f"model.layers.{i}."
            mods = {k: linear(p + k + ".weight") for k in ("self_attn.q_proj", "self_attn.k_proj",
                                                             "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                                                             "mlp.up_proj", "mlp.down_proj")}
            mods["ln1"] = tensors[p + "input_layernorm.weight"]
            mods["ln2"] = tensors[p + "post_attention_layernorm.weight"]
            self.layers.append(mods)
        self.embed, self.norm = tensors["model.embed_tokens.weight"], tensors["model.norm.weight"]
        self.lm_head = tensors.get("lm_head.weight", self.embed)
        self.head_dim, self.eps = head_dim, eps

    def modules(self):
        return [m for layer in self.layers for m in layer.values() if not hasattr(m, "dim")]

    def _rms(self, x, w):
        import torch

        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def __call__(self, ids):
        import torch
        import torch.nn.functional as F

        b, s = ids.shape
        x = F.embedding(ids, self.embed)
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(s, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()

        def rope(t):  # [b, heads, s, d]
            t1, t2 = t.chunk(2, -1)
            return t * cos + torch.cat([-t2, t1], -1) * sin

        for L in self.layers:
            h = self._rms(x, L["ln1"])
            q = L["self_attn.q_proj"](h).view(b, s, -1, self.head_dim).transpose(1, 2)
            k = L["self_attn.k_proj"](h).view(b, s, -1, self.head_dim).transpose(1, 2)
            v = L["self_attn.v_proj"](h).view(b, s, -1, self.head_dim).transpose(1, 2)
            q, k = rope(q), rope(k)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
            x = x + L["self_attn.o_proj"](a)
            h = self._rms(x, L["ln2"])
            x = x + L["mlp.down_proj"](F.silu(L["mlp.gate_proj"](h)) * L["mlp.up_proj"](h))
        return F.linear(self._rms(x, self.norm), self.lm_head)
