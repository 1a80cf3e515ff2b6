"""``LLM.chat`` and ``LLM.get_default_sampling_params`` (vLLM ``entrypoints/llm.py``, ``config.py``
``ModelConfig.get_diff_sampling_param``; cases after vLLM's ``tests/entrypoints/llm/test_chat.py``), against
transformers: the prompt ``apply_chat_template`` renders, its greedy tokens, and ``GenerationConfig``'s diff."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from paged_serve import LLM, SamplingParams
from transformers import AutoTokenizer, GenerationConfig

GREEDY = SamplingParams(temperature=0, max_tokens=8)
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I assist you today?"},
    {"role": "user", "content": "Write an essay about the importance of higher education."},
]
PARTS_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% for p in m['content'] %}{{ p['text'] }}{% endfor %}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def chat_llm(checkpoint):
    path, hf = checkpoint("llama")
    return LLM(path, num_gpu_blocks=128), AutoTokenizer.from_pretrained(path), hf


def _greedy(hf, ids, n=8):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)[0, len(ids) :]
    out = out.tolist()
    return out[: out.index(1) + 1] if 1 in out else out  # </s> (id 1) ends it, as the engine stops there


def test_chat_renders_like_transformers_and_generates_its_greedy_tokens(chat_llm):
    llm, tok, hf = chat_llm
    (out,) = llm.chat(CONVERSATION, GREEDY, use_tqdm=False)
    want = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert out.prompt == want
    ids = tok(want, add_special_tokens=False).input_ids  # the template has the special tokens
    assert out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == _greedy(hf, ids)


def test_chat_takes_a_list_of_conversations_in_order(chat_llm):
    llm, tok, hf = chat_llm
    second = [{"role": "user", "content": "the lazy dog"}]
    outs = llm.chat([CONVERSATION, second, CONVERSATION], GREEDY, use_tqdm=False)
    convos = (CONVERSATION, second, CONVERSATION)
    assert [o.prompt for o in outs] == [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                                        for c in convos]  # fmt: skip
    for out in outs:
        assert out.outputs[0].token_ids == _greedy(hf, out.prompt_token_ids)
    assert outs[0].outputs[0].token_ids == outs[2].outputs[0].token_ids


def test_chat_options_match_transformers_apply_chat_template(chat_llm):
    llm, tok, _ = chat_llm
    convo = CONVERSATION[:3]
    cases = [
        ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
        ({"add_generation_prompt": False, "continue_final_message": True},
         {"add_generation_prompt": False, "continue_final_message": True}),
        ({"chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"},
         {"chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"}),
        ({"chat_template": "{{ greeting }}{{ messages[0]['content'] }}", "chat_template_kwargs": {"greeting": "hi "}},
         {"chat_template": "{{ greeting }}{{ messages[0]['content'] }}", "greeting": "hi "}),
        ({"chat_template": "{{ tools | length }} tools: {{ messages[-1]['content'] }}",
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         {"chat_template": "{{ tools | length }} tools: {{ messages[-1]['content'] }}",
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ]  # fmt: skip
    for ours, theirs in cases:
        (out,) = llm.chat(convo, SamplingParams(max_tokens=1), use_tqdm=False, **ours)
        want = tok.apply_chat_template(convo, tokenize=False, **{"add_generation_prompt": True, **theirs})
        assert out.prompt == want, ours
    (cont,) = llm.chat(convo, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
    assert cont.prompt.endswith("How can I assist you today?")  # the model continues the assistant's message


def test_chat_content_parts_and_the_template_s_content_format(chat_llm):
    """A template looping over ``message['content']`` gets OpenAI's parts ("auto" detects it); a string-content
    template gets the parts joined by newlines."""
    llm, tok, _ = chat_llm
    parts = [{"role": "user", "content": [{"type": "text", "text": "the quick"}, {"type": "text", "text": "fox"}]}]
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "the lazy dog"}]}]
    (out,) = llm.chat([{"role": "user", "content": "the lazy dog"}], GREEDY, use_tqdm=False,
                      chat_template=PARTS_TEMPLATE)  # fmt: skip
    assert out.prompt == tok.apply_chat_template(as_parts, tokenize=False, chat_template=PARTS_TEMPLATE,
                                                 add_generation_prompt=True)  # fmt: skip
    (out,) = llm.chat(parts, GREEDY, use_tqdm=False)
    joined = [{"role": "user", "content": "the quick\nfox"}]
    assert out.prompt == tok.apply_chat_template(joined, tokenize=False, add_generation_prompt=True)
    (out,) = llm.chat(parts, GREEDY, use_tqdm=False, chat_template=PARTS_TEMPLATE,
                      chat_template_content_format="openai")  # fmt: skip
    assert out.prompt == "<|user|>the quickfox</s><|assistant|>"


def test_chat_refuses_what_it_cannot_do_naming_it(chat_llm):
    llm, _, _ = chat_llm
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        llm.chat(CONVERSATION, GREEDY, continue_final_message=True)
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(CONVERSATION, GREEDY, chat_template_content_format="xml")
    with pytest.raises(ValueError, match="'image_url' is not supported"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], GREEDY)
    with pytest.raises(ValueError, match="LoRA"):
        llm.chat(CONVERSATION, GREEDY, lora_request=object())


# ------------------------------------------------------------------ get_default_sampling_params
KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def _with_generation_config(checkpoint, tmp_path, config: dict | None):
    path, hf = checkpoint("llama")
    target = tmp_path / "model"
    shutil.copytree(path, target)
    (target / "generation_config.json").unlink(missing_ok=True)
    if config is not None:
        (target / "generation_config.json").write_text(json.dumps(config))
    return str(target), hf


def _transformers_diff(path) -> dict:
    """vLLM's semantics over transformers' ``GenerationConfig(...).to_diff_dict()``, keys renamed to vLLM's."""
    try:
        diff = GenerationConfig.from_pretrained(path).to_diff_dict()
    except OSError:  # no generation_config.json: vLLM falls back to from_model_config, which sets no sampling key
        return {}
    params = {k: diff[k] for k in KEYS if diff.get(k) is not None}
    if "max_new_tokens" in params:
        params["max_tokens"] = params.pop("max_new_tokens")
    return params


@pytest.mark.parametrize(
    "config",
    [
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1, "max_new_tokens": 7,
         "min_p": 0.05, "do_sample": True, "bos_token_id": 0, "eos_token_id": 1},
        {"temperature": 1.0, "top_k": 50, "do_sample": True},  # transformers' old defaults, still a diff in v5
        {"bos_token_id": 0, "eos_token_id": 1},  # what save_pretrained writes: no sampling key
        None,
    ],
)  # fmt: skip
def test_default_sampling_params_are_the_generation_config_s_diff_as_transformers_reads_it(
    checkpoint, tmp_path, config
):
    path, _ = _with_generation_config(checkpoint, tmp_path, config)
    llm = LLM(path, num_gpu_blocks=32)
    diff = llm.llm_engine.model_config.get_diff_sampling_param()
    assert diff == _transformers_diff(path)
    params = llm.get_default_sampling_params()
    for name, value in {**vars(SamplingParams()), **diff}.items():
        if not name.startswith("_"):
            assert getattr(params, name) == value, name


def test_generation_config_vllm_a_directory_and_overrides(checkpoint, tmp_path):
    path, _ = _with_generation_config(checkpoint, tmp_path, {"temperature": 0.6, "max_new_tokens": 7})
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"top_p": 0.5}))
    assert LLM(path, num_gpu_blocks=32, generation_config="vllm").get_default_sampling_params().temperature == 1.0
    llm = LLM(path, num_gpu_blocks=32, generation_config=str(other))
    assert llm.llm_engine.model_config.get_diff_sampling_param() == {"top_p": 0.5}
    llm = LLM(path, num_gpu_blocks=32, override_generation_config={"temperature": 0.2, "min_p": 0.1})
    assert llm.llm_engine.model_config.get_diff_sampling_param() == {"temperature": 0.2, "min_p": 0.1,
                                                                     "max_tokens": 7}  # fmt: skip
    with pytest.raises(ValueError, match="override_generation_config must be a dict"):
        LLM(path, override_generation_config="temperature=0.2")


def test_generate_without_sampling_params_uses_the_model_s_defaults(checkpoint, tmp_path):
    """generation_config.json asks for 3 new tokens and top_k=1 (greedy): ``generate(prompts)`` follows it."""
    path, hf = _with_generation_config(checkpoint, tmp_path, {"max_new_tokens": 3, "top_k": 1, "do_sample": True})
    llm = LLM(path, num_gpu_blocks=32)
    (out,) = llm.generate(["the quick brown fox"], use_tqdm=False)
    ids = out.prompt_token_ids
    assert out.outputs[0].token_ids == _greedy(hf, ids, 3) and len(out.outputs[0].token_ids) <= 3
    (vllm_defaults,) = LLM(path, num_gpu_blocks=32, generation_config="vllm").generate(
        ["the quick brown fox"], SamplingParams(temperature=0), use_tqdm=False
    )
    assert len(vllm_defaults.outputs[0].token_ids) == 16 or vllm_defaults.outputs[0].finish_reason == "stop"
