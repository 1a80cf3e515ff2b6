# hf-lite drop-in >>>
# Upstream: huggingface/transformers docs/source/en/pad_truncation.md
#           at commit 0e5b57e7673f58a8689d9f5f1e96c7007fdb5b13: the instructions of its table, in its order.
# Changes (tests/test_example_pad_truncation.py runs this file and, with the import swapped back, under transformers):
#   from transformers import AutoTokenizer -> from hf_lite import AutoTokenizer
#   The page continues preprocessing.md, whose tokenizer ("google-bert/bert-base-cased", a hub name) is swapped for
#   a local checkpoint of a family hf-lite has (a GPT-2 byte-level BPE directory, the first argument), and whose
#   batch_sentences it uses. Each instruction's result is printed (the page shows none); the table's two
#   "Not possible" cells have no line; STRATEGY is one of the page's three.
# CUDA-only lines: none.
# hf-lite drop-in <<<
import sys

from hf_lite import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
batch_sentences = [
    "But what about second breakfast?",
    "Don't think he knows about second breakfast, Pip.",
    "What about elevensies?",
]
STRATEGY = "longest_first"


def show(instruction, encoded):
    print(instruction)
    for input_ids, attention_mask in zip(encoded["input_ids"], encoded["attention_mask"]):
        print("   ", input_ids, attention_mask)


# no truncation
show("tokenizer(batch_sentences)", tokenizer(batch_sentences))
show("tokenizer(batch_sentences, padding=True)", tokenizer(batch_sentences, padding=True))
show("tokenizer(batch_sentences, padding='longest')", tokenizer(batch_sentences, padding="longest"))
show("tokenizer(batch_sentences, padding='max_length')", tokenizer(batch_sentences, padding="max_length"))
show("tokenizer(batch_sentences, padding='max_length', max_length=42)",
     tokenizer(batch_sentences, padding="max_length", max_length=42))
show("tokenizer(batch_sentences, padding=True, pad_to_multiple_of=8)",
     tokenizer(batch_sentences, padding=True, pad_to_multiple_of=8))

# truncation to max model input length
show("tokenizer(batch_sentences, truncation=True)", tokenizer(batch_sentences, truncation=True))
show("tokenizer(batch_sentences, truncation=STRATEGY)", tokenizer(batch_sentences, truncation=STRATEGY))
show("tokenizer(batch_sentences, padding=True, truncation=True)",
     tokenizer(batch_sentences, padding=True, truncation=True))
show("tokenizer(batch_sentences, padding=True, truncation=STRATEGY)",
     tokenizer(batch_sentences, padding=True, truncation=STRATEGY))
show("tokenizer(batch_sentences, padding='max_length', truncation=True)",
     tokenizer(batch_sentences, padding="max_length", truncation=True))
show("tokenizer(batch_sentences, padding='max_length', truncation=STRATEGY)",
     tokenizer(batch_sentences, padding="max_length", truncation=STRATEGY))

# truncation to specific length
show("tokenizer(batch_sentences, truncation=True, max_length=42)",
     tokenizer(batch_sentences, truncation=True, max_length=42))
show("tokenizer(batch_sentences, truncation=STRATEGY, max_length=42)",
     tokenizer(batch_sentences, truncation=STRATEGY, max_length=42))
show("tokenizer(batch_sentences, padding=True, truncation=True, max_length=42)",
     tokenizer(batch_sentences, padding=True, truncation=True, max_length=42))
show("tokenizer(batch_sentences, padding=True, truncation=STRATEGY, max_length=42)",
     tokenizer(batch_sentences, padding=True, truncation=STRATEGY, max_length=42))
show("tokenizer(batch_sentences, padding='max_length', truncation=True, max_length=42)",
     tokenizer(batch_sentences, padding="max_length", truncation=True, max_length=42))
show("tokenizer(batch_sentences, padding='max_length', truncation=STRATEGY, max_length=42)",
     tokenizer(batch_sentences, padding="max_length", truncation=STRATEGY, max_length=42))
