"""Model and training sizes for the pipelines: small enough to train on two CPU cores in a minute or two."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ModelPreset:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    seq_length: int

    def llama_config(self, bos: int, eos: int) -> dict:
        """Keyword arguments for a Llama config (hf-lite's and transformers' alike)."""
        return dict(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.seq_length,
            bos_token_id=bos,
            eos_token_id=eos,
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
            initializer_range=0.02,
            attention_dropout=0.0,
        )


PRESETS = {
    "tiny": ModelPreset(128, 4, 4, 2, 352, 2048, 128),
    "small": ModelPreset(256, 6, 8, 4, 688, 4096, 256),
}


@dataclass
class TrainSpec:
    """Everything a rank needs to train: paths, model shape, optimisation, the trainer's own options."""

    out_dir: str
    tokenizer_dir: str
    checkpoint_dir: str
    model: ModelPreset
    bos_token_id: int
    eos_token_id: int
    steps: int = 150
    micro_batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 10
    seed: int = 0
    device: str = "cpu"
    options: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)
