"""Side by side with transformers 5 on every tiny configuration hf-lite supports: GPT-2 tied / untied, Llama MHA,
GQA, MQA with biases, linear and llama3 RoPE scaling. Checkpoints go both ways; logits are exact in fp32 and within
transformers' own bf16 drift in bf16; loss and gradients with -100 labels match; greedy, beam search (every
``early_stopping``), sampling and beam sampling give the same tokens with the penalties on.

hf-lite's own differential suite (no upstream file mirrors it).
"""

import pytest
import torch
import transformers
from hf_lite import AutoModelForCausalLM
from hf_lite_testing import make_model

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
CONFIGS = {
    "gpt2_tied": ("gpt2", {}),
    "gpt2_untied": ("gpt2", {"tie_word_embeddings": False}),
    "llama_mha": ("llama", {"num_key_value_heads": 4}),
    "llama_gqa": ("llama", {"num_key_value_heads": 2}),
    "llama_mqa_bias": ("llama", {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True}),
    "llama_linear_rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama_llama3_rope": ("llama", {"rope_scaling": LLAMA3, "tie_word_embeddings": True}),
}
PAD = 3


def _batch(seed=0, length=24):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 97, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5], mask[1, :2] = 0, 0  # left padding
    ids = ids.masked_fill(mask == 0, PAD)
    return ids, mask


@pytest.fixture(params=list(CONFIGS), scope="module")
def pair(request, tmp_path_factory):
    """(hf-lite model, transformers model, directory) with the same weights; biases made non-zero so they count."""
    kind, kw = CONFIGS[request.param]
    ours = make_model(kind, seed=sum(map(ord, request.param)), **kw)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    directory = tmp_path_factory.mktemp(request.param)
    ours.save_pretrained(directory)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    return ours, theirs, directory


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def test_checkpoints_go_both_ways_with_exact_fp32_logits(pair, tmp_path):
    ours, theirs, _ = pair
    ids, mask = _batch()
    expected = _logits(theirs, ids, mask)
    torch.testing.assert_close(_logits(ours, ids, mask), expected, rtol=0, atol=0)
    theirs.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(again) is type(ours) and again.config.tie_word_embeddings == ours.config.tie_word_embeddings
    torch.testing.assert_close(_logits(again, ids, mask), expected, rtol=0, atol=0)
    assert not torch.allclose(
        _logits(make_model("gpt2" if "GPT2" in type(ours).__name__ else "llama", seed=99), ids, mask),
        expected,
        atol=1e-3,
    ), "sanity: other weights differ"


def test_bf16_logits_within_transformers_own_bf16_drift(pair):
    _, theirs_fp32, directory = pair
    ours = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    assert ours.dtype == theirs.dtype == torch.bfloat16
    ids, mask = _batch(1)
    reference = _logits(theirs_fp32, ids, mask)
    their_drift = (_logits(theirs, ids, mask).float() - reference).abs().max()
    our_drift = (_logits(ours, ids, mask).float() - reference).abs().max()
    assert our_drift <= their_drift * 1.01, (our_drift, their_drift)
    assert their_drift > 0, "sanity: bf16 does drift"


def test_loss_and_gradients_with_ignored_labels_match(pair):
    ours, theirs, _ = pair
    ids, mask = _batch(2)
    labels = ids.masked_fill(mask == 0, -100)
    labels[2, 10:14] = -100
    results = []
    for model in (ours, theirs):
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        model.zero_grad()
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=1e-6)
    assert set(grads_a) == set(grads_b)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6, msg=name)


PENALTIES = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, bad_words_ids=[[11], [40, 41]])
DECODING = {
    "greedy": dict(do_sample=False),
    "beam_early_true": dict(num_beams=3, early_stopping=True, num_return_sequences=2, length_penalty=1.5),
    "beam_early_false": dict(num_beams=3, early_stopping=False, length_penalty=0.5),
    "beam_early_never": dict(num_beams=2, early_stopping="never", num_return_sequences=2, length_penalty=-0.5),
    "sampling": dict(do_sample=True, top_k=20, top_p=0.9, temperature=0.8, num_return_sequences=2),
    "beam_sampling": dict(do_sample=True, num_beams=2, top_k=15, temperature=1.2),
}


def test_generation_is_token_identical_with_penalties(pair):
    ours, theirs, _ = pair
    ids, mask = _batch(3, length=8)
    free = theirs.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD)
    eos = [int(free[0, -6]), int(free[2, -3])]  # ids the free run produces, so rows do stop early
    hit_eos = False
    for name, case in DECODING.items():
        kw = dict(attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=PAD, **PENALTIES, **case)
        torch.manual_seed(17)
        expected = theirs.generate(ids, **kw)
        torch.manual_seed(17)
        got = ours.generate(ids, **kw)
        assert torch.equal(got, expected), name
        hit_eos = hit_eos or bool(torch.isin(got[:, ids.shape[1] :], torch.tensor(eos)).any())
    assert hit_eos, "sanity: some row stops on EOS"
