"""``pipeline("text-generation")`` side by side with transformers' own pipeline on the same tiny checkpoint: the
same records (structure and text) for strings, lists, chats, batches, returned sequences, prefixes and tensors,
greedy and seeded sampling.

Mirrors transformers' tests/pipelines/test_pipelines_text_generation.py (its small-model cases, with a tiny local
Llama / GPT-2 and a BPE trained in the test instead of the hub's models).
"""

import os

import pytest
import torch
import transformers
from hf_lite import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, TextGenerationPipeline, pipeline
from hf_lite.pipelines import get_supported_tasks
from hf_lite.pipelines.text_generation import ReturnType
from hf_lite_testing import make_model

CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USER = [{"role": "user", "content": "What is 2 + 2?"}]
PREFILL = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y = "}]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def ckpt(request, tmp_path_factory, trained_tokenizer_dir):
    """A tiny model and the trained BPE (pad token, chat template) saved in one directory."""
    directory = str(tmp_path_factory.mktemp(f"pipe_{request.param}"))
    tok = PreTrainedTokenizerFast.from_pretrained(trained_tokenizer_dir, pad_token="<pad>", eos_token="<|endoftext|>",
                                                  chat_template=CHAT)
    tok.save_pretrained(directory)
    ids = dict(eos_token_id=tok.eos_token_id, bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"))
    if request.param == "llama":
        ids["pad_token_id"] = tok.pad_token_id
    make_model(request.param, seed=3, vocab_size=len(tok), **ids).save_pretrained(directory)
    return directory


def _both(ckpt, inputs, seed=0, init=None, **call):
    """The same call through transformers' pipeline and hf-lite's, each from the same seed."""
    outs = []
    for lib in (transformers, None):
        make = transformers.pipeline if lib else pipeline
        pipe = make("text-generation", model=ckpt, **(init or {}))
        torch.manual_seed(seed)
        outs.append(pipe(inputs, **call))
    return outs


CASES = {
    "string_greedy": ("def f(x):", dict(do_sample=False, max_new_tokens=8)),
    "string_default_sampling": ("def f(x):", dict(max_new_tokens=8)),
    "string_top_k_temperature": ("import os", dict(do_sample=True, top_k=5, temperature=1.3, max_new_tokens=6)),
    "list_batched_sampling": (["def f(x):", "import os", "class A(object):"], dict(max_new_tokens=6, batch_size=2)),
    "list_batched_greedy": (["def f(x):", "import os", "class A"], dict(do_sample=False, max_new_tokens=5,
                                                                       batch_size=3)),
    "num_return_sequences_new_text": (["def f(x):", "import os"], dict(max_new_tokens=6, num_return_sequences=3,
                                                                       return_full_text=False)),
    "beam_search_sequences": ("def f(x):", dict(do_sample=False, num_beams=3, num_return_sequences=2,
                                                max_new_tokens=5)),
    "return_tensors": ("def f(x):", dict(max_new_tokens=4, return_tensors=True)),
    "batched_return_tensors": (["def", "import os, sys"], dict(max_new_tokens=4, return_tensors=True,
                                                               batch_size=2)),
    "prefix": ("def f(x):", dict(max_new_tokens=4, prefix="import os\n", do_sample=False)),
    "prefix_with_max_length": ("def f(x):", dict(max_length=12, prefix="import os\n", do_sample=False)),
    "stop_sequence": ("def f(x):", dict(max_new_tokens=12, do_sample=False, stop_sequence="e")),
    "hole": ("def f(x):\n    return x + 1\n" * 4, dict(max_new_tokens=5, handle_long_generation="hole",
                                                          do_sample=False)),
    "chat": (USER, dict(max_new_tokens=5)),
    "chat_prefill_continued": (PREFILL, dict(max_new_tokens=5)),
    "chats_batched": ([USER, PREFILL], dict(max_new_tokens=5, batch_size=2)),
    "chat_new_text_only": (USER, dict(max_new_tokens=5, return_full_text=False, do_sample=False)),
    "repetition_penalty": ("def f(x):", dict(max_new_tokens=8, repetition_penalty=1.5, do_sample=False)),
    "special_tokens_kept": ("def f(x):", dict(max_new_tokens=8, skip_special_tokens=False, return_full_text=False)),
    "tokenizer_encode_kwargs": ("def f(x): return x", dict(max_new_tokens=4, do_sample=False,
                                                            tokenizer_encode_kwargs={"truncation": True,
                                                                                     "max_length": 4})),
    "add_special_tokens": ("def f(x):", dict(max_new_tokens=4, add_special_tokens=True, do_sample=False)),
    "prefill_not_continued": (PREFILL, dict(max_new_tokens=5, continue_final_message=False)),
    "scores_per_record": ("def f(x):", dict(max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                                            output_scores=True, return_full_text=False)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_transformers_pipeline(ckpt, case):
    inputs, call = CASES[case]
    init = {"tokenizer": (ckpt, {"model_max_length": 16})} if case == "hole" else None
    theirs, ours = _both(ckpt, inputs, init=init, **call)
    if case == "scores_per_record":  # fp32 scores: GPT-2's logits agree to rounding, not bitwise
        torch.testing.assert_close(ours[0].pop("scores"), theirs[0].pop("scores"), rtol=1e-5, atol=1e-6)
    assert ours == theirs
    if case == "hole":  # the prompt was cut to its last 16 - 5 tokens
        pipe = pipeline("text-generation", model=ckpt, **init)
        assert pipe.preprocess(inputs, handle_long_generation="hole", max_new_tokens=5)["input_ids"].shape[1] == 11
    if case == "string_default_sampling":
        assert _both(ckpt, inputs, seed=1, **call)[1] != ours, "sanity: another seed samples other tokens"
    if case == "list_batched_sampling":
        assert isinstance(ours, list) and all(isinstance(x, list) and len(x) == 1 for x in ours)
    if case == "num_return_sequences_new_text":
        assert [len(x) for x in ours] == [3, 3] and len({r["generated_text"] for r in ours[0]}) > 1
    if case == "scores_per_record":
        assert set(ours[0]) == {"generated_text"}, "the scores were checked (and popped) above"
    if case == "chat_prefill_continued":
        assert ours[0]["generated_text"][-1]["content"].startswith("y = ")


def test_generation_kwargs_at_construction_and_call_merge_as_in_transformers(ckpt):
    init = {"max_new_tokens": 3, "do_sample": False}
    theirs, ours = _both(ckpt, ["def f(x):", "import"], init=init, max_new_tokens=6, batch_size=2)
    assert ours == theirs
    theirs, ours = _both(ckpt, "def f(x):", init=init)
    assert ours == theirs


def test_model_and_tokenizer_as_objects(ckpt):
    model, tok = AutoModelForCausalLM.from_pretrained(ckpt), AutoTokenizer.from_pretrained(ckpt)
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    assert isinstance(pipe, TextGenerationPipeline) and pipe.model is model and pipe.tokenizer is tok
    assert tok.padding_side == "left", "batched decoder-only generation pads on the left"
    reference = transformers.pipeline("text-generation", model=ckpt)
    torch.manual_seed(1)
    expected = reference(["def f(x):", "import os"], max_new_tokens=5, batch_size=2)
    torch.manual_seed(1)
    assert pipe(["def f(x):", "import os"], max_new_tokens=5, batch_size=2) == expected
    with pytest.raises(Exception, match="Impossible to guess which tokenizer"):
        pipeline("text-generation", model=model)


def test_generator_input_streams_results(ckpt):
    pipe = pipeline("text-generation", model=ckpt, do_sample=False, max_new_tokens=3)
    prompts = [f"x = {i}" for i in range(3)]
    out = pipe(p for p in prompts)
    assert not isinstance(out, list)
    assert list(out) == [pipe(p) for p in prompts]


def test_unsupported_task_raises_transformers_key_error(ckpt):
    with pytest.raises(KeyError, match=r"Unknown task fill-mask, available tasks are \['feature-extraction', "
                       r"'sentiment-analysis', 'text-classification', 'text-generation'\]"):
        pipeline("fill-mask", model=ckpt)
    with pytest.raises(KeyError, match="has been removed from transformers"):
        pipeline("summarization", model=ckpt)
    assert get_supported_tasks() == ["feature-extraction", "sentiment-analysis", "text-classification",
                                     "text-generation"]


def test_invalid_arguments_raise_as_in_transformers(ckpt):
    pipe = pipeline("text-generation", model=ckpt)
    with pytest.raises(ValueError, match="not a valid value for `handle_long_generation`"):
        pipe("x", handle_long_generation="bad")
    with pytest.raises(ValueError, match="mutually exclusive with `return_tensors`"):
        pipe("x", return_full_text=True, return_tensors=True)
    assert pipe._sanitize_parameters(return_full_text=False)[2]["return_type"] is ReturnType.NEW_TEXT


def test_batching_without_pad_token_raises(ckpt, tmp_path):
    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.pad_token = None
    pipe = pipeline("text-generation", model=ckpt, tokenizer=tok)
    with pytest.raises(ValueError, match="without pad_token cannot do batching"):
        pipe(["a", "bb"], batch_size=2, max_new_tokens=2)


def test_save_pretrained_writes_a_directory_both_load(ckpt, tmp_path):
    pipe = pipeline("text-generation", model=ckpt, do_sample=False, max_new_tokens=4)
    pipe.save_pretrained(tmp_path)
    assert os.path.isfile(tmp_path / "config.json") and os.path.isfile(tmp_path / "tokenizer.json")
    again = transformers.pipeline("text-generation", model=str(tmp_path), do_sample=False, max_new_tokens=4)
    assert again("def f(x):") == pipe("def f(x):")


def test_continue_final_message_keeps_trailing_spaces_as_transformers(ckpt):
    ours, theirs = AutoTokenizer.from_pretrained(ckpt), transformers.AutoTokenizer.from_pretrained(ckpt)
    for conv in (PREFILL, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b  "}]):
        kw = dict(continue_final_message=True, add_generation_prompt=False)
        assert ours.apply_chat_template(conv, tokenize=False, **kw) == theirs.apply_chat_template(
            conv, tokenize=False, **kw)
        assert ours.apply_chat_template(conv, tokenize=False, **kw).endswith(conv[-1]["content"])


def test_key_dataset_and_dtype_as_in_transformers(ckpt):
    """pipeline_tutorial.md's ``pipe(KeyDataset(dataset, "text"), batch_size=...)`` streams results; ``dtype=``
    loads the model in that dtype."""
    from hf_lite.pipelines.pt_utils import KeyDataset
    from transformers.pipelines.pt_utils import KeyDataset as TheirKeyDataset

    rows = [{"text": t, "n": i} for i, t in enumerate(["def f(x):", "import os", "class A:"])]
    outs = []
    for make, key_dataset in ((transformers.pipeline, TheirKeyDataset), (pipeline, KeyDataset)):
        pipe = make("text-generation", model=ckpt, max_new_tokens=4)
        torch.manual_seed(2)
        out = pipe(key_dataset(rows, "text"), batch_size=2)
        assert not isinstance(out, list)
        outs.append(list(out))
    assert outs[1] == outs[0] and len(outs[1]) == 3
    ours = pipeline("text-generation", model=ckpt, dtype=torch.bfloat16)
    assert ours.model.dtype == transformers.pipeline("text-generation", model=ckpt, dtype=torch.bfloat16).model.dtype
    assert ours.model.dtype == torch.bfloat16 and ours.dtype == torch.bfloat16
