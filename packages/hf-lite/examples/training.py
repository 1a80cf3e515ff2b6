# hf-lite drop-in >>>
# Upstream: huggingface/transformers docs/source/en/training.md
#           at commit 020a37d2264e60dc7beb9634c3e87ad870073e2c: its code blocks (tokenization, loading a model,
#           training configuration, training), in its order.
# Changes (tests/test_example_pipeline_docs.py runs this file and, with the imports swapped back, under transformers):
#   from transformers import AutoTokenizer, DataCollatorForLanguageModeling -> from hf_lite import ...
#   from transformers import AutoModelForCausalLM, TrainingArguments, Trainer -> from hf_lite import ...
#   The hub model (Qwen/Qwen3-0.6B) and dataset (karthiksagarn/astro_horoscope) are swapped for a local checkpoint
#   (the first argument) and a local JSON-lines file with a "horoscope" column (the second), loaded with
#   load_dataset("json", ...); max_length 48 (the page: 512); train_test_split is seeded (seed=0); output_dir is the
#   third argument; use_cpu=True where there is no GPU (transformers refuses bf16=True on such a machine without
#   it); the login and push_to_hub lines are not run (no hub). The log history (timings aside) and a final
#   evaluate() are printed as JSON (the page prints nothing).
# CUDA-only lines: none (bf16=True autocasts on the CPU too).
# hf-lite drop-in <<<
import json
import sys

import torch
from datasets import load_dataset
from hf_lite import AutoTokenizer, DataCollatorForLanguageModeling

model_name = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(model_name)
dataset = load_dataset("json", data_files=sys.argv[2], split="train")


def tokenize(batch):
    return tokenizer(
        batch["horoscope"],
        truncation=True,
        max_length=48,
    )


dataset = dataset.map(tokenize, batched=True, remove_columns=dataset.column_names)
dataset = dataset.train_test_split(test_size=0.1, seed=0)

data_collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)

from hf_lite import AutoModelForCausalLM, Trainer, TrainingArguments  # noqa: E402

model = AutoModelForCausalLM.from_pretrained(model_name, dtype="auto")

training_args = TrainingArguments(
    output_dir=sys.argv[3],
    num_train_epochs=3,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=8,
    gradient_checkpointing=True,
    bf16=True,
    learning_rate=2e-5,
    logging_steps=10,
    eval_strategy="epoch",
    save_strategy="epoch",
    load_best_model_at_end=True,
    use_cpu=not torch.cuda.is_available(),
)

trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=dataset["train"],
    eval_dataset=dataset["test"],
    processing_class=tokenizer,
    data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
)

trainer.train()
timings = ("runtime", "per_second")
print(json.dumps([{k: v for k, v in h.items() if not k.endswith(timings)} for h in trainer.state.log_history]))
print(json.dumps({k: v for k, v in trainer.evaluate().items() if not k.endswith(timings)}))
