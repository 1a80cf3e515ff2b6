"""LlamaConfig: Llama's hyper-parameters with transformers' names, including GQA and RoPE parameters.

RoPE settings are kept in transformers 5's ``rope_parameters`` dict (``rope_type``, ``rope_theta``, scaling keys);
the 4.x spellings ``rope_theta`` / ``rope_scaling`` are accepted and folded into it.
"""

from __future__ import annotations

from ...configuration_utils import PretrainedConfig

# rope_type -> the rope_parameters keys it needs. The scaled variants (linear, llama3) are registered with their
# inverse-frequency rule by _compat/models/rope_utils.py (transformers' ROPE_INIT_FUNCTIONS).
ROPE_REQUIRED: dict[str, tuple[str, ...]] = {"default": ()}


class LlamaConfig(PretrainedConfig):
    model_type = "llama"

    def __init__(self, vocab_size: int = 32000, hidden_size: int = 4096, intermediate_size: int = 11008,
                 num_hidden_layers: int = 32, num_attention_heads: int = 32, num_key_value_heads: int | None = None,
                 hidden_act: str = "silu", max_position_embeddings: int = 2048, initializer_range: float = 0.02,
                 rms_norm_eps: float = 1e-6, pad_token_id: int | None = None, bos_token_id: int | None = 1,
                 eos_token_id: int | list[int] | None = 2, tie_word_embeddings: bool = False,
                 rope_theta: float | None = None, rope_scaling: dict | None = None, rope_parameters: dict | None = None,
                 attention_bias: bool = False, attention_dropout: float = 0.0, mlp_bias: bool = False,
                 head_dim: int | None = None, **kwargs):
        kwargs.pop("pretraining_tp", None)
        super().__init__(vocab_size=vocab_size, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.head_dim = hidden_size // num_attention_heads if head_dim is None else head_dim
        self.rope_parameters = self._standardize_rope(rope_parameters, rope_scaling, rope_theta)
        self._validate()

    @staticmethod
    def _standardize_rope(rope_parameters, rope_scaling, rope_theta) -> dict:
        params = dict(rope_parameters or rope_scaling or {})
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params.pop("type")
        params.setdefault("rope_type", "default")
        if rope_theta is not None:
            params["rope_theta"] = float(rope_theta)
        params.setdefault("rope_theta", 10000.0)
        kind = params["rope_type"]
        if kind not in ROPE_REQUIRED:
            raise ValueError(f"rope_type {kind!r} is not supported; use one of {sorted(ROPE_REQUIRED)}")
        missing = [k for k in ROPE_REQUIRED[kind] if k not in params]
        if missing:
            raise ValueError(f"rope_type {kind!r} needs {missing} in rope_parameters, got {params}")
        return params

    @property
    def rope_theta(self) -> float:
        return self.rope_parameters["rope_theta"]

    @property
    def rope_scaling(self) -> dict | None:
        return None if self.rope_parameters["rope_type"] == "default" else self.rope_parameters

    def _validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
