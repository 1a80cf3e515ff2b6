"""What every model's forward offers and what the Trainer relies on, on tiny GPT-2 and Llama, against transformers:
hidden states, attention weights, tuple outputs, token_type_ids, unknown kwargs refused, gradient checkpointing
(and the cache it turns off), input-embedding grads, ``_no_split_modules``, ``floating_point_ops`` and the loss.

Mirrors transformers' tests/test_modeling_common.py (test_hidden_states_output, test_attention_outputs,
test_training_gradient_checkpointing, test_model_outputs_equivalence) for the two architectures.
"""

import pytest
import torch
import transformers
from hf_lite_testing import make_model

KINDS = ["gpt2", "llama"]


def _pair(kind, tmp_path, attn_implementation="sdpa"):
    ours = make_model(kind)
    ours.save_pretrained(tmp_path / kind)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / kind, attn_implementation=attn_implementation)
    return ours, theirs.eval()


def _batch(seed=0):
    ids = torch.randint(3, 97, (2, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids, mask


@pytest.mark.parametrize("kind", KINDS)
def test_hidden_states_and_attentions_match_transformers(kind, tmp_path):
    ours, theirs = _pair(kind, tmp_path, attn_implementation="eager")  # eager: transformers returns the weights
    ids, mask = _batch()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        b = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(a.hidden_states) == len(b.hidden_states) == 3 and len(a.attentions) == len(b.attentions) == 2
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x[1], y[1], rtol=1e-5, atol=1e-5)  # row 1 has no padding
        torch.testing.assert_close(x[0, 3:], y[0, 3:], rtol=1e-5, atol=1e-5)
    for x, y in zip(a.attentions, b.attentions):
        assert x.shape == (2, 4, 7, 7)
        torch.testing.assert_close(x[:, :, 3:], y[:, :, 3:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)  # the eager path gives the same logits
    plain = ours(input_ids=ids, attention_mask=mask)
    assert plain.hidden_states is None and plain.attentions is None


@pytest.mark.parametrize("kind", KINDS)
def test_return_dict_false_gives_the_tuple_transformers_gives(kind, tmp_path):
    ours, theirs = _pair(kind, tmp_path)
    ids, _ = _batch()
    with torch.no_grad():
        a = ours(input_ids=ids, labels=ids, return_dict=False)
        b = theirs(input_ids=ids, labels=ids, return_dict=False)
        assert isinstance(a, tuple) and len(a) == len(b) == 3
        torch.testing.assert_close(a[0], b[0]) and torch.testing.assert_close(a[1], b[1])
        only_logits = ours(input_ids=ids, use_cache=False, return_dict=False)
        assert len(only_logits) == len(theirs(input_ids=ids, use_cache=False, return_dict=False)) == 1
        base = (ours.transformer if kind == "gpt2" else ours.model)(input_ids=ids, use_cache=False, return_dict=False)
        assert len(base) == 1 and base[0].shape == (2, 7, 32)


@pytest.mark.parametrize("kind", KINDS)
def test_config_return_dict_false_gives_tuples_and_generate_still_works(kind, tmp_path):
    """``from_pretrained(dir, return_dict=False)`` sets ``config.return_dict``, which forwards read when called
    without ``return_dict`` (transformers' ``can_return_tuple``); the base model's tuple equals transformers'. (5.24's
    own heads break on it: their base returns the tuple the head reads ``.last_hidden_state`` from.)"""
    import hf_lite

    ours, theirs = _pair(kind, tmp_path)
    ids, _ = _batch()
    tuples = hf_lite.AutoModelForCausalLM.from_pretrained(tmp_path / kind, return_dict=False)
    theirs_tuples = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / kind, return_dict=False)
    assert tuples.config.return_dict is False
    with torch.no_grad():
        out = tuples(input_ids=ids, labels=ids)
        assert isinstance(out, tuple) and len(out) == 3
        torch.testing.assert_close(out[1], ours(input_ids=ids).logits)
        assert tuples(input_ids=ids, return_dict=True).logits.shape == (2, 7, 97)
        base, theirs_base = (m.transformer if kind == "gpt2" else m.model for m in (tuples, theirs_tuples))
        a, b = base(input_ids=ids, use_cache=False), theirs_base(input_ids=ids, use_cache=False)
        assert isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 1
        torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-5)
    for kw in ({}, {"num_beams": 2}):
        torch.testing.assert_close(
            tuples.generate(ids, max_new_tokens=4, do_sample=False, **kw),
            ours.generate(ids, max_new_tokens=4, do_sample=False, **kw),
        )


def test_gpt2_token_type_ids_match_transformers(tmp_path):
    ours, theirs = _pair("gpt2", tmp_path)
    ids, mask = _batch()
    types = torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(a, theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits)
        assert not torch.allclose(a, ours(input_ids=ids, attention_mask=mask).logits, atol=1e-3)


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_forward_kwargs_raise(kind):
    model = make_model(kind)
    with pytest.raises(TypeError, match="bogus"):
        model(input_ids=torch.tensor([[1, 2]]), bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        (model.transformer if kind == "gpt2" else model.model)(input_ids=torch.tensor([[1, 2]]), bogus=1)
    if kind == "llama":
        with pytest.raises(TypeError, match="token_type_ids"):
            model(input_ids=torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 0]]))


def _grads(model, ids, labels):
    model.zero_grad()
    model(input_ids=ids, labels=labels).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_recomputes_blocks_and_keeps_gradients(kind, reentrant):
    model = make_model(kind).train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    ids, _ = _batch()
    labels = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.3, -100)
    reference = _grads(model, ids, labels)
    assert model.supports_gradient_checkpointing and not model.is_gradient_checkpointing
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert model.is_gradient_checkpointing
    blocks = model.transformer.h if kind == "gpt2" else model.model.layers
    calls = []
    hook = blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    checkpointed = _grads(model, ids, labels)
    hook.remove()
    assert len(calls) == 2, "the block ran again in backward"
    for name, grad in reference.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_checkpointing_turns_the_cache_off_in_training_like_transformers(kind, tmp_path, caplog):
    from hf_lite.modeling_layers import _warn_once

    _warn_once.cache_clear()  # transformers warns once per process too
    ours, theirs = _pair(kind, tmp_path)
    ids, _ = _batch()
    for model in (ours, theirs):
        model.train()
        assert model(input_ids=ids).past_key_values is not None  # training alone keeps it (transformers)
        model.activation_checkpointing_enable()  # transformers 5.24's name, which its Trainer calls
        with caplog.at_level("WARNING"):
            assert model(input_ids=ids).past_key_values is None
        with torch.no_grad():  # nothing to replay: generation from a training-mode model still caches
            assert model(input_ids=ids).past_key_values is not None
    assert "incompatible with gradient checkpointing" in caplog.text


@pytest.mark.parametrize("kind", KINDS)
def test_enable_input_require_grads_reaches_layers_past_frozen_embeddings(kind):
    model = make_model(kind).train()
    for module in model.modules():  # GPT-2's position table too: nothing before the first block needs grad
        if isinstance(module, torch.nn.Embedding):
            module.weight.requires_grad_(False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    ids, _ = _batch()
    model(input_ids=ids, labels=ids).loss.backward()
    first = next(model.transformer.h[0].parameters()) if kind == "gpt2" else model.model.layers[0].mlp.up_proj.weight
    assert first.grad is not None and first.grad.abs().sum() > 0
    model.disable_input_require_grads()
    model.zero_grad()
    with pytest.warns(UserWarning, match="requires_grad"):  # torch: reentrant checkpoint without grad inputs
        model(input_ids=ids, labels=ids).loss.backward()
    assert first.grad is None


@pytest.mark.parametrize("kind", KINDS)
def test_trainer_hooks_match_transformers(kind, tmp_path):
    from hf_lite.loss_utils import ForCausalLMLoss

    ours, theirs = _pair(kind, tmp_path)
    assert set(ours._no_split_modules) == set(theirs._no_split_modules)
    inputs = {"input_ids": torch.ones(4, 9, dtype=torch.long)}
    trainer_formula = 6 * inputs["input_ids"].numel() * theirs.num_parameters(exclude_embeddings=True)
    assert ours.floating_point_ops(inputs) == trainer_formula
    assert ours.loss_function is ForCausalLMLoss and ours.accepts_loss_kwargs
    ids, mask = _batch()
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        for n in (None, 5, torch.tensor(7)):
            kw = {} if n is None else {"num_items_in_batch": n}
            a = ours(input_ids=ids, attention_mask=mask, labels=labels, **kw).loss
            torch.testing.assert_close(a, theirs(input_ids=ids, attention_mask=mask, labels=labels, **kw).loss)
    ours.loss_function = lambda logits, labels, vocab_size, **kw: logits.sum() * 0 + 42.0
    assert ours(input_ids=ids, labels=ids).loss.item() == 42.0
