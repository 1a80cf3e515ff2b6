"""Input embeddings (``megatron/core/models/common/embeddings``)."""

from mega_par.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from mega_par.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding, apply_rotary_pos_emb

__all__ = ["LanguageModelEmbedding", "RotaryEmbedding", "apply_rotary_pos_emb"]
