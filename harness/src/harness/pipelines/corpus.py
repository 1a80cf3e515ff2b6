"""The training text and its tokens: Python's own standard library sources (on every machine, offline) or a file or
directory the user names, a byte-level BPE tokenizer trained on it with hf-lite, and the token stream saved for the
ranks (``tokens.pt``; ``tokens.bin`` as uint16 for mega-par's data loader)."""

from __future__ import annotations

import logging
import sysconfig
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
EOS = "<|endoftext|>"


def default_corpus_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read_corpus(path: Path | None, max_bytes: int) -> list[str]:
    """Text documents, in a fixed order, up to ``max_bytes`` in total: every ``*.py`` under a directory, or one file."""
    root = Path(path) if path is not None else default_corpus_dir()
    if not root.exists():
        raise FileNotFoundError(f"corpus {root} does not exist")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.py") if "test" not in p.parts)
    docs, total = [], 0
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        text = text[: max_bytes - total]
        docs.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    if not docs:
        raise ValueError(f"corpus {root} holds no readable text")
    logger.info("corpus: %d documents, %d characters from %s", len(docs), total, root)
    return docs


def train_tokenizer(docs: list[str], vocab_size: int, out_dir: Path):
    """A GPT-2-style byte-level BPE tokenizer trained by hf-lite, saved as tokenizer.json + tokenizer_config.json."""
    from hf_lite import PreTrainedTokenizerFast
    from hf_lite.tokenization_utils_fast import byte_level_bpe_tokenizer

    base = PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe_tokenizer(), bos_token=EOS, eos_token=EOS)
    tokenizer = base.train_new_from_iterator(docs, vocab_size=vocab_size, new_special_tokens=[EOS])
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def tokenize(tokenizer, docs: list[str], out_dir: Path) -> torch.Tensor:
    """All documents as one token stream, EOS between them; saved for the ranks."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for doc in docs:
        ids += tokenizer(doc, add_special_tokens=False)["input_ids"] + [eos]
    tokens = torch.tensor(ids, dtype=torch.int32)
    torch.save(tokens, out_dir / "tokens.pt")
    if int(tokens.max()) < 1 << 16:
        tokens.to(torch.int64).numpy().astype("uint16").tofile(out_dir / "tokens.bin")
    return tokens


def blocks(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """The stream cut into ``[n, length]`` rows (the tail that does not fill a row is dropped)."""
    n = tokens.numel() // length
    if n < 1:
        raise ValueError(f"the corpus has {tokens.numel()} tokens, fewer than one block of {length}")
    return tokens[: n * length].view(n, length).to(torch.long)
