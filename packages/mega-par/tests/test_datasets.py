"""``mega_par.datasets`` / ``tokenizers`` / ``tools.preprocess_data``.

Ports from Megatron's ``tests/unit_tests/data/``: ``test_preprocess_data.py`` (tokenise JSON lines with the
tool, read the ``.bin``/``.idx`` back: every document's ids, eod appended), ``test_builder.py`` (mock builds,
split sizes, blends drawing in proportion to the weights), ``test_gpt_dataset.py`` (mock samples: tokens and
labels shifted by one; ``reset_position_ids`` / ``reset_attention_mask`` / ``eod_mask_loss`` at eod).
The ``.idx`` bytes are checked against the layout of ``megatron/core/datasets/indexed_dataset.py``
(``_IndexWriter``), spelled out with ``struct`` here. Left out: the ``.npy`` index cache, S3/MSC storage,
multimodal sequence modes in the tool, sentence splitting.
"""

import json
import struct

import numpy
import pytest
import torch
from mega_par.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from mega_par.datasets.blended_megatron_dataset_config import Split
from mega_par.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from mega_par.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder
from mega_par.datasets.utils import compile_helpers
from mega_par.tokenizers import MegatronTokenizer
from mega_par.tools import preprocess_data

DOCS = [([5, 6, 7], [2, 1]), ([9], [1]), ([1, 2, 3, 4, 60000], [5])]


def _expected_idx(dtype_code, itemsize, lengths, doc_indices):
    pointers = numpy.concatenate([[0], numpy.cumsum(lengths)[:-1]]) * itemsize
    return (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", dtype_code)
            + struct.pack("<QQ", len(lengths), len(doc_indices)) + numpy.array(lengths, "<i4").tobytes()
            + numpy.array(pointers, "<i8").tobytes() + numpy.array(doc_indices, "<i8").tobytes())


@pytest.mark.parametrize("dtype,code", [(numpy.uint16, 8), (numpy.int32, 4)])
def test_idx_and_bin_bytes_follow_megatrons_layout(tmp_path, dtype, code):
    prefix = str(tmp_path / "d")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for toks, lens in DOCS:
        builder.add_document(torch.tensor(toks), lens)
    builder.add_item(torch.tensor([3, 3]))
    builder.end_document()
    builder.finalize(prefix + ".idx")
    lengths = [2, 1, 1, 5, 2]
    want = _expected_idx(code, numpy.dtype(dtype).itemsize, lengths, [0, 2, 3, 4, 5])
    assert open(prefix + ".idx", "rb").read() == want
    assert open(prefix + ".bin", "rb").read() == numpy.array([5, 6, 7, 9, 1, 2, 3, 4, 60000, 3, 3], dtype).tobytes()
    ds = IndexedDataset(prefix)
    assert [ds[i].tolist() for i in range(len(ds))] == [[5, 6], [7], [9], [1, 2, 3, 4, 60000], [3, 3]]
    assert ds.get(3, offset=1, length=2).tolist() == [2, 3]
    assert ds.document_indices.tolist() == [0, 2, 3, 4, 5] and ds.index.dtype is dtype


def test_bad_idx_header_and_dtype_code_are_named(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"")
    (tmp_path / "x.idx").write_bytes(b"NOTANIDX\x00" + bytes(40))
    with pytest.raises(ValueError, match=r"bad header b'NOTANIDX\\x00', cannot read: .*x.idx"):
        IndexedDataset(str(tmp_path / "x"))
    with pytest.raises(ValueError, match="unknown IndexedDataset dtype code 9"):
        DType.dtype_from_code(9)
    assert DType.optimal_dtype(65499) is numpy.uint16 and DType.optimal_dtype(65500) is numpy.int32


def _hf_tokenizer_dir(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "the cat sat on a mat dog ran far".split()
    vocab = {"<eos>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")
    hf.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "tok")


def test_preprocess_data_tool_writes_what_indexed_dataset_reads(tmp_path):
    tok_dir = _hf_tokenizer_dir(tmp_path)
    lines = ["the cat sat on a mat", "a dog ran far", "the dog sat"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    prefixes = preprocess_data.main(["--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "p"),
                                     "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok_dir,
                                     "--append-eod", "--workers", "1"])
    assert prefixes == {"text": str(tmp_path / "p_text_document")}
    tokenizer = MegatronTokenizer.from_pretrained(tok_dir)
    ds = IndexedDataset(prefixes["text"])
    assert ds.index.dtype is numpy.uint16  # vocab 11 < 65500
    for i, text in enumerate(lines):
        assert ds[i].tolist() == tokenizer.tokenize(text) + [tokenizer.eod]
        assert tokenizer.detokenize(ds[i][:-1]) == text
    assert ds.document_indices.tolist() == [0, 1, 2, 3]


def _config(**kw):
    base = dict(random_seed=0, sequence_length=8, reset_position_ids=False, reset_attention_mask=False,
                eod_mask_loss=False, tokenizer=MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"},
                                                                                 vocab_size=64))
    return GPTDatasetConfig(**{**base, **kw})


def test_mock_dataset_from_the_example_gives_megatrons_sample_dict():
    compile_helpers()  # numpy helpers: a no-op
    config = _config(sequence_length=64, mid_level_dataset_surplus=0.005)
    assert config.mock and config.split == "1,1,1"
    train, valid, test = BlendedMegatronDatasetBuilder(MockGPTDataset, [1000, None, None], lambda: True,
                                                       config).build()
    assert len(train) >= 1000 and valid is not None and test is not None
    s = train[0]
    assert set(s) == {"tokens", "labels", "loss_mask", "attention_mask", "position_ids"}
    assert s["tokens"].shape == (64,) and s["attention_mask"].shape == (1, 64, 64)
    assert torch.equal(s["tokens"][1:], s["labels"][:-1])
    assert torch.equal(s["attention_mask"][0], torch.triu(torch.ones(64, 64, dtype=torch.bool), 1))
    low = train.dataset  # the sample is the concatenated mock documents from its start
    doc, off = train.sample_index[train.shuffle_index[0]]
    stream = numpy.concatenate([low[int(d)] for d in train.document_index[doc:doc + 64]])[off:off + 65]
    assert s["tokens"].tolist() == stream[:64].tolist() and s["labels"].tolist() == stream[1:].tolist()
    assert BlendedMegatronDatasetBuilder(MockGPTDataset, [10, None, None], lambda: False, config).build() == \
        [None, None, None]


def _indexed(tmp_path, name, docs):
    prefix = str(tmp_path / name)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for d in docs:
        b.add_document(d, [len(d)])
    b.finalize(prefix + ".idx")
    return prefix


def test_gpt_dataset_samples_cover_the_token_stream_and_reset_at_eod(tmp_path):
    docs = [[1, 2, 3, 63], [4, 5, 63], [6, 7, 8, 9, 10, 63]] * 4  # 63 = eod of the null tokenizer
    prefix = _indexed(tmp_path, "a", docs)
    config = _config(blend=([prefix], None), split="1,0,0", sequence_length=4)
    ds = GPTDataset(IndexedDataset(prefix), prefix, numpy.arange(len(docs)), None, Split.train, config)
    stream = numpy.concatenate([docs[i] for i in ds.document_index])
    assert len(ds) == (len(stream) - 1) // 4
    for j in range(len(ds)):
        k = int(numpy.nonzero(ds.shuffle_index == j)[0][0])
        assert ds[k]["tokens"].tolist() == stream[4 * j:4 * j + 4].tolist()
    reset = GPTDataset(ds.dataset, prefix, ds.indices, None, ds.index_split,
                       _config(blend=([prefix], None), split="1,0,0", sequence_length=4, reset_position_ids=True,
                               reset_attention_mask=True, eod_mask_loss=True))
    for k in range(len(reset)):
        s = reset[k]
        eods = (s["tokens"] == 63).nonzero().flatten().tolist()
        if eods and eods[0] < 3:
            e = eods[0]
            assert s["position_ids"][e + 1].item() == 0 and s["loss_mask"][e].item() == 0.0
            assert s["attention_mask"][0, e + 1, : e + 1].all()  # the next document does not see this one
            break
    else:
        pytest.fail("no sample with an eod before its last token")


def test_blend_draws_in_proportion_to_the_weights_and_splits(tmp_path):
    a = _indexed(tmp_path, "a", [[1, 2, 3, 4, 5, 63]] * 50)
    b = _indexed(tmp_path, "b", [[7, 8, 63]] * 50)
    config = _config(blend=([a, b], [0.7, 0.3]), split="80,20,0", sequence_length=4)
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [100, 20, None], lambda: True, config).build()
    assert test is None and len(train) == 100 and len(valid) == 20
    assert numpy.bincount(train.dataset_index).tolist() == [70, 30]
    assert {train[i]["dataset_id"] for i in range(100)} == {0, 1}
    assert train.datasets[0].indices.tolist() == list(range(40)) and valid.datasets[0].indices.tolist() == \
        list(range(40, 50))
    with pytest.raises(ValueError, match=r"blend prefixes \(2\) and weights \(1\) must be equal in number"):
        _config(blend=([a, b], [1.0]), split="1")


def test_megatron_tokenizer_null_text_and_unknown_library():
    tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=64)
    assert (tok.vocab_size, tok.eod, tok.tokenize("3 4 5"), tok.detokenize([3, 4])) == (64, 63, [3, 4, 5], "3 4")
    with pytest.raises(ValueError, match="library 'sentencepiece' is not supported"):
        MegatronTokenizer.from_pretrained(metadata_path={"library": "sentencepiece"})
