"""GPT-2: hf-lite <-> transformers checkpoints interchange with equal logits and loss."""

import pytest
import torch
import transformers
from hf_lite import AutoModelForCausalLM, GPT2LMHeadModel, GPT2Model
from hf_lite_testing import make_model, tiny_gpt2_config


def _inputs(seed=1, batch=3, length=12, vocab=97):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    mask[1, :1] = 0
    return ids, mask


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_save_in_hf_lite_load_in_transformers_logits_and_loss_equal(kind, tmp_path):
    ours = make_model(kind)
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == type(ours).__name__
    ids, mask = _inputs()
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, labels=labels)
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-6, atol=1e-6)
    # sanity: the comparison can fail (a different seed gives different logits)
    other = make_model(kind, seed=1)
    with torch.no_grad():
        assert not torch.allclose(other(input_ids=ids).logits, b.logits, atol=1e-3)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_save_in_transformers_load_in_hf_lite(kind, tmp_path):
    ours = make_model(kind)
    hf_config = transformers.AutoConfig.for_model(
        kind, **{k: v for k, v in ours.config.to_dict().items() if k not in ("model_type", "architectures", "dtype")}
    )
    torch.manual_seed(3)
    theirs = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    theirs.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded).__name__ == type(theirs).__name__
    ids, mask = _inputs(seed=5)
    with torch.no_grad():
        a = loaded(input_ids=ids, attention_mask=mask, labels=ids)
        b = theirs(input_ids=ids, attention_mask=mask, labels=ids)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-6, atol=1e-6)


def test_gpt2_kv_cache_step_by_step_equals_full_forward():
    model = make_model("gpt2")
    ids, mask = _inputs(batch=2, length=10)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], position_ids=pos[:, :6], use_cache=True)
        steps = [out.logits]
        cache = out.past_key_values
        for t in range(6, 10):
            out = model(
                input_ids=ids[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=pos[:, t : t + 1],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            steps.append(out.logits)
    assert cache.get_seq_length() == 10
    # padded rows' positions come from the mask, so only compare the last row (no padding) against the default
    torch.testing.assert_close(torch.cat(steps, 1)[2:], full[2:], rtol=1e-5, atol=1e-5)


def test_gpt2_tied_embeddings_and_base_model_loading(tmp_path):
    model = make_model("gpt2")
    assert model.lm_head.weight is model.transformer.wte.weight
    model.save_pretrained(tmp_path)
    base = GPT2Model.from_pretrained(tmp_path)  # checkpoint keys carry the "transformer." prefix
    torch.testing.assert_close(base.wte.weight, model.transformer.wte.weight)
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    head, info = GPT2LMHeadModel.from_pretrained(base_dir, output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert head.lm_head.weight is head.transformer.wte.weight
    torch.testing.assert_close(head.lm_head.weight, model.lm_head.weight)


def test_gpt2_forward_rejects_bad_inputs():
    model = make_model("gpt2")
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model()
    with pytest.raises(ValueError, match="n_positions"):
        model(input_ids=torch.zeros(1, 65, dtype=torch.long))


def test_gpt2_weight_init_follows_the_paper_scaling():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_gpt2_config(n_embd=128, n_head=4, n_layer=8))
    block = model.transformer.h[3]
    assert abs(block.attn.c_attn.weight.std().item() - 0.02) < 0.002
    for proj in (block.attn.c_proj, block.mlp.c_proj):  # residual projections: 0.02 / sqrt(2 * n_layer)
        assert abs(proj.weight.std().item() - 0.02 / 4) < 0.0005
    assert torch.all(block.ln_1.weight == 1) and torch.all(block.attn.c_attn.bias == 0)
