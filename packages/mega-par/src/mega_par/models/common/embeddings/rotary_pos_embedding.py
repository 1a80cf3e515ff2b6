"""``megatron.core.models.common.embeddings.rotary_pos_embedding``: the rotary embedding mega_par's attention uses
(:mod:`mega_par.transformer.attention`)."""

from mega_par.transformer.attention import RotaryEmbedding, apply_rotary_pos_emb

__all__ = ["RotaryEmbedding", "apply_rotary_pos_emb"]
