"""TextStreamer / TextIteratorStreamer receive what generate produces, and stop strings end generation."""

import threading

import torch
from hf_lite import GPT2Tokenizer, TextIteratorStreamer, TextStreamer
from hf_lite_testing import make_model


def _model_and_tokenizer(trained_tokenizer_dir):
    tok = GPT2Tokenizer.from_pretrained(trained_tokenizer_dir, eos_token="<|endoftext|>")
    model = make_model("gpt2", vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    return model, tok


def test_text_streamer_prints_the_generated_text(trained_tokenizer_dir, capsys):
    model, tok = _model_and_tokenizer(trained_tokenizer_dir)
    prompt = tok("def main():\n    return", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=15, streamer=TextStreamer(tok, skip_prompt=True), eos_token_id=None)
    printed = capsys.readouterr().out
    assert printed == tok.decode(out[0, prompt["input_ids"].shape[1] :]) + "\n"
    assert len(printed.strip()) > 0


def test_text_iterator_streamer_from_another_thread(trained_tokenizer_dir):
    model, tok = _model_and_tokenizer(trained_tokenizer_dir)
    prompt = tok("import os\n", return_tensors="pt")
    streamer = TextIteratorStreamer(tok, timeout=60)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(
            out=model.generate(**prompt, max_new_tokens=12, streamer=streamer, eos_token_id=None)
        )
    )
    thread.start()
    chunks = list(streamer)
    thread.join()
    assert "".join(chunks) == tok.decode(result["out"][0])
    assert len(chunks) >= 2, "sanity: text arrives in several pieces"


def test_stop_strings_end_generation(trained_tokenizer_dir):
    model, tok = _model_and_tokenizer(trained_tokenizer_dir)
    prompt = tok("class A:\n", return_tensors="pt")
    n = prompt["input_ids"].shape[1]
    free = model.generate(**prompt, max_new_tokens=20, eos_token_id=None)
    stop = tok.decode(free[0, n + 4 : n + 6])  # text of the 5th and 6th new tokens
    assert stop.strip(), "sanity: a non-empty stop string"
    out = model.generate(**prompt, max_new_tokens=20, eos_token_id=None, stop_strings=[stop], tokenizer=tok)
    text = tok.decode(out[0, n:])
    assert stop in text and out.shape[1] < free.shape[1]
    assert torch.equal(out[0], free[0, : out.shape[1]])


def test_streamer_and_stop_strings_survive_ids_past_the_tokenizer(trained_tokenizer_dir, capsys):
    """A model vocabulary padded past len(tokenizer) may generate ids the tokenizer does not know."""
    from hf_lite.generation import LogitsProcessor, LogitsProcessorList

    tok = GPT2Tokenizer.from_pretrained(trained_tokenizer_dir, eos_token="<|endoftext|>")
    model = make_model("gpt2", vocab_size=len(tok) + 16, eos_token_id=tok.eos_token_id)

    class ForcePaddedIds(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] % 2:  # every other step picks an id only the model's vocabulary has
                scores = scores.clone()
                scores[:, len(tok) + 3] = 1e4
            return scores

    prompt = tok("def f():", return_tensors="pt")
    out = model.generate(
        **prompt,
        max_new_tokens=8,
        eos_token_id=None,
        logits_processor=LogitsProcessorList([ForcePaddedIds()]),
        streamer=TextStreamer(tok),
        stop_strings=["never appears"],
        tokenizer=tok,
    )
    assert (out >= len(tok)).sum() >= 3, "sanity: padded ids were generated"
    assert capsys.readouterr().out == tok.decode(out[0]) + "\n"
