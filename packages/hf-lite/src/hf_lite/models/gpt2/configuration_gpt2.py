"""GPT2Config: GPT-2's hyper-parameters with transformers' names (``n_embd``, ``n_layer``...)."""

from __future__ import annotations

from ...configuration_utils import PretrainedConfig


class GPT2Config(PretrainedConfig):
    model_type = "gpt2"
    attribute_map = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
                     "num_hidden_layers": "n_layer"}

    def __init__(self, vocab_size: int = 50257, n_positions: int = 1024, n_embd: int = 768, n_layer: int = 12,
                 n_head: int = 12, n_inner: int | None = None, activation_function: str = "gelu_new",
                 resid_pdrop: float = 0.1, embd_pdrop: float = 0.1, attn_pdrop: float = 0.1,
                 layer_norm_epsilon: float = 1e-5, initializer_range: float = 0.02, scale_attn_weights: bool = True,
                 scale_attn_by_inverse_layer_idx: bool = False, reorder_and_upcast_attn: bool = False,
                 bos_token_id: int | None = 50256, eos_token_id: int | list[int] | None = 50256,
                 tie_word_embeddings: bool = True, **kwargs):
        super().__init__(vocab_size=vocab_size, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.n_positions = n_positions
        self.n_embd = n_embd
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_inner = n_inner
        self.activation_function = activation_function
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attn_pdrop = attn_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.scale_attn_weights = scale_attn_weights
        self.scale_attn_by_inverse_layer_idx = scale_attn_by_inverse_layer_idx
        self.reorder_and_upcast_attn = reorder_and_upcast_attn
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        for name, value in (("vocab_size", vocab_size), ("n_positions", n_positions), ("n_layer", n_layer)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"GPT2Config.{name} must be a positive int, got {value!r}")
