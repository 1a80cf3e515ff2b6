"""Input embeddings (``megatron/core/models/common/embeddings``)."""

from mega_par.models.common.embeddings.language_model_embedding import LanguageModelEmbedding

__all__ = ["LanguageModelEmbedding"]
