"""The transformers names unseen scripts reach for first, side by side with transformers: the learning-rate
schedules, ``enable_full_determinism``, the collators' signatures,
``TrainingArguments``' grouped setters and extra fields, the Trainer's helper methods, and the import paths.

Mirrors transformers' tests/optimization/test_optimization.py
(ScheduleInitTest), tests/trainer/test_data_collator.py and the setter cases of tests/trainer/test_trainer.py."""

import dataclasses
import inspect
import logging

import hf_lite
import hf_lite.generation
import hf_lite.integrations
import hf_lite.utils
import pytest
import torch
from hf_lite_testing import trainer_model

transformers = pytest.importorskip("transformers")


# ---------------------------------------------------------------------- schedules
SCHEDULES = [
    ("get_polynomial_decay_schedule_with_warmup", dict(num_warmup_steps=2, num_training_steps=10, lr_end=1e-4,
                                                       power=2.0)),
    ("get_inverse_sqrt_schedule", dict(num_warmup_steps=3)),
    ("get_inverse_sqrt_schedule", dict(num_warmup_steps=0, timescale=4)),
    ("get_cosine_with_hard_restarts_schedule_with_warmup", dict(num_warmup_steps=2, num_training_steps=10,
                                                                num_cycles=3)),
    ("get_cosine_with_min_lr_schedule_with_warmup", dict(num_warmup_steps=2, num_training_steps=10, min_lr=1e-3)),
    ("get_cosine_with_min_lr_schedule_with_warmup", dict(num_warmup_steps=1, num_training_steps=8, min_lr_rate=0.1,
                                                         num_cycles=1.0)),
    ("get_linear_schedule_with_warmup", dict(num_warmup_steps=2, num_training_steps=10)),
    ("get_constant_schedule_with_warmup", dict(num_warmup_steps=2)),
]


@pytest.mark.parametrize("name,kwargs", SCHEDULES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SCHEDULES)])
def test_schedules_match_transformers(name, kwargs):
    lrs = {}
    for lib in (hf_lite, transformers):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
        scheduler = getattr(lib, name)(optimizer, **kwargs)
        trace = []
        for _ in range(14):
            trace.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        lrs[lib.__name__] = trace
    assert lrs["hf_lite"] == pytest.approx(lrs["transformers"], rel=1e-12, abs=0)
    assert list(inspect.signature(getattr(hf_lite, name)).parameters) == list(
        inspect.signature(getattr(transformers, name)).parameters)


def test_schedule_argument_errors_as_transformers():
    for lib in (hf_lite, transformers):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-5)
        with pytest.raises(ValueError, match=r"lr_end \(0.001\) must be smaller than initial lr"):
            lib.get_polynomial_decay_schedule_with_warmup(optimizer, 1, 5, lr_end=1e-3)
        with pytest.raises(ValueError, match="Only one of min_lr or min_lr_rate"):
            lib.get_cosine_with_min_lr_schedule_with_warmup(optimizer, 1, 5, min_lr=0.1, min_lr_rate=0.1)


# ---------------------------------------------------------------------- determinism, collators
def test_enable_full_determinism_sets_what_transformers_sets(monkeypatch):
    for key in ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "FLASH_ATTENTION_DETERMINISTIC"):
        monkeypatch.delenv(key, raising=False)
    states = []
    try:
        for lib in (transformers, hf_lite):
            lib.enable_full_determinism(123)
            states.append((torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
                           torch.backends.cudnn.benchmark, torch.rand(3)))
            import os
            states[-1] += (os.environ["CUBLAS_WORKSPACE_CONFIG"], os.environ["FLASH_ATTENTION_DETERMINISTIC"])
            torch.use_deterministic_algorithms(False)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    (t_det, t_cudnn, t_bench, t_rand, *t_env), (o_det, o_cudnn, o_bench, o_rand, *o_env) = states
    assert (o_det, o_cudnn, o_bench, o_env) == (t_det, t_cudnn, t_bench, t_env) == (True, True, False,
                                                                                    [":16:8", "1"])
    assert torch.equal(o_rand, t_rand)


def test_torch_distributed_zero_first_without_a_process_group_runs_the_block():
    ran = []
    for rank in (-1, 0, 3):
        with hf_lite.torch_distributed_zero_first(rank):
            ran.append(rank)
    assert ran == [-1, 0, 3]


def test_collator_signatures_and_default_data_collator_match_transformers(trained_tokenizer_dir):
    for name in ("DataCollatorForLanguageModeling", "DataCollatorWithPadding", "DefaultDataCollator"):
        ours = [(f.name, f.default) for f in dataclasses.fields(getattr(hf_lite, name))]
        theirs = [(f.name, f.default) for f in dataclasses.fields(getattr(transformers, name))]
        assert ours == theirs, name
    features = [{"input_ids": [1, 2, 3], "label": 1}, {"input_ids": [4, 5, 6], "label": 0}]
    ours, theirs = hf_lite.DefaultDataCollator()(features), transformers.DefaultDataCollator()(features)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    tok = hf_lite.AutoTokenizer.from_pretrained(trained_tokenizer_dir, pad_token="<pad>")
    t_tok = transformers.AutoTokenizer.from_pretrained(trained_tokenizer_dir, pad_token="<pad>")
    rows = [{"input_ids": tok("def f(x):")["input_ids"]}, {"input_ids": tok("import os")["input_ids"]}]
    ours = hf_lite.DataCollatorForLanguageModeling(tok, False, False, 0.15, seed=3, pad_to_multiple_of=8)
    theirs = transformers.DataCollatorForLanguageModeling(t_tok, False, False, 0.15, seed=3, pad_to_multiple_of=8)
    o, t = ours.torch_call(rows), theirs.torch_call(rows)
    assert all(torch.equal(o[k], t[k]) for k in ("input_ids", "attention_mask", "labels"))


# ---------------------------------------------------------------------- TrainingArguments
SETTERS = [
    ("set_training", dict(learning_rate=1e-3, batch_size=4, weight_decay=0.1, num_epochs=2, max_steps=10,
                          gradient_accumulation_steps=2, seed=5, activation_checkpointing=True)),
    ("set_evaluate", dict(strategy="steps", steps=20, batch_size=2, accumulation_steps=3, delay=1.0,
                          loss_only=True)),
    ("set_testing", dict(batch_size=3, loss_only=True)),
    ("set_save", dict(strategy="epoch", steps=7, total_limit=2)),
    ("set_logging", dict(strategy="steps", steps=3, level="info", first_step=True, nan_inf_filter=True,
                         on_each_node=False, replica_level="error")),
    ("set_optimizer", dict(name="adamw_torch", learning_rate=2e-4, weight_decay=0.01, beta1=0.8, beta2=0.99,
                           epsilon=1e-6)),
    ("set_lr_scheduler", dict(name="cosine", num_epochs=4.0, max_steps=12, warmup_steps=0.1)),
    ("set_dataloader", dict(train_batch_size=16, eval_batch_size=4, drop_last=True, num_workers=0,
                            pin_memory=False, ignore_data_skip=True, sampler_seed=9)),
    ("set_push_to_hub", dict(model_id="org/m", strategy="checkpoint", token="hf_x", private_repo=True,
                             always_push=True, revision="dev")),
]


@pytest.mark.parametrize("setter,kwargs", SETTERS, ids=[s for s, _ in SETTERS])
def test_training_arguments_setters_match_transformers(tmp_path, setter, kwargs):
    ours = hf_lite.TrainingArguments(output_dir=str(tmp_path))
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path))
    o_before, t_before = ours.to_dict(), theirs.to_dict()
    assert getattr(ours, setter)(**kwargs) is ours
    getattr(theirs, setter)(**kwargs)
    assert list(inspect.signature(getattr(ours, setter)).parameters) == list(
        inspect.signature(getattr(theirs, setter)).parameters)
    o, t = ours.to_dict(), theirs.to_dict()
    t_changed = {k for k in t if t[k] != t_before[k]}
    o_changed = {k for k in o if o[k] != o_before[k]}
    assert t_changed and o_changed == t_changed
    assert {k: o[k] for k in o_changed} == {k: t[k] for k in t_changed}
    with pytest.raises(ValueError, match="requires a positive value for `steps`"):
        ours.set_save(strategy="steps", steps=0)


def test_training_arguments_fields_and_defaults_match_transformers(tmp_path):
    ours = {f.name: f for f in dataclasses.fields(hf_lite.TrainingArguments)}
    theirs = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments)}
    for name, field in ours.items():
        if name in theirs and name not in ("warmup_ratio",):
            o = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            t = theirs[name].default
            t = t if t is not dataclasses.MISSING else theirs[name].default_factory()
            assert o == t or (name, o, t) in {("report_to", "none", None), ("disable_tqdm", None, None)}, name
    added = ["hub_token", "hub_model_id", "hub_strategy", "eval_accumulation_steps", "label_smoothing_factor",
             "full_determinism", "tf32", "ddp_bucket_cap_mb", "skip_memory_metrics", "include_for_metrics"]
    assert all(name in ours for name in added)
    args = hf_lite.TrainingArguments(output_dir=str(tmp_path), hub_token="secret", eval_accumulation_steps=2)
    assert args.to_dict()["hub_token"] == "<HUB_TOKEN>" == transformers.TrainingArguments(
        output_dir=str(tmp_path), hub_token="secret").to_dict()["hub_token"]
    sanitized = args.to_sanitized_dict()
    assert sanitized["train_batch_size"] == 8 and sanitized["include_for_metrics"] == "[]"
    with pytest.raises(ValueError, match=r"label_smoothing_factor=0.1: hf-lite supports only 0.0"):
        hf_lite.TrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1)
    with pytest.raises(ValueError, match="deepspeed='ds.json'"):
        hf_lite.TrainingArguments(output_dir=str(tmp_path), deepspeed="ds.json")
    changed = hf_lite.TrainingArguments(output_dir=str(tmp_path)).set_optimizer(args="foo=1")
    with pytest.raises(ValueError, match="optim_args='foo=1'"):
        hf_lite.Trainer(trainer_model(), changed)


# ---------------------------------------------------------------------- the Trainer's helpers
def test_trainer_helper_methods_match_transformers(tmp_path, trained_tokenizer_dir, caplog):
    from hf_lite_testing import corpus_blocks

    pytest.importorskip("accelerate")
    blocks = corpus_blocks(trained_tokenizer_dir, n_blocks=8)
    ours = trainer_model()
    ours.save_pretrained(tmp_path / "init")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "init")
    ours.model.embed_tokens.weight.requires_grad_(False)
    theirs.model.embed_tokens.weight.requires_grad_(False)
    common = dict(per_device_train_batch_size=4, max_steps=2, report_to="none", disable_tqdm=True,
                  optim="adamw_torch", weight_decay=0.1, warmup_steps=1, save_strategy="no")
    o = hf_lite.Trainer(ours, hf_lite.TrainingArguments(output_dir=str(tmp_path / "o"), **common),
                        train_dataset=blocks)
    t = transformers.Trainer(model=theirs, args=transformers.TrainingArguments(output_dir=str(tmp_path / "t"),
                                                                                **common), train_dataset=blocks)
    assert o.get_num_trainable_parameters() == t.get_num_trainable_parameters()
    for trainer in (o, t):
        with pytest.raises(ValueError, match="Trainer optimizer is None"):
            trainer.get_learning_rates()
        trainer.create_optimizer_and_scheduler(num_training_steps=4)
    assert o.get_learning_rates() == t.get_learning_rates()
    assert [len(g) for g in o.get_optimizer_group()] == [len(g) for g in t.get_optimizer_group()]
    param = ours.model.norm.weight
    assert o.get_optimizer_group(param)["weight_decay"] == 0.0
    assert o.num_examples(o.get_train_dataloader()) == t.num_examples(t.get_train_dataloader()) == 8
    for name in ("get_tp_size", "get_cp_size", "get_sp_size"):
        assert getattr(o, name)() == getattr(t, name)() == 1
    assert o.get_total_train_batch_size(o.args) == t.get_total_train_batch_size(t.args) == 4
    metrics = {"train_runtime": 3725.456, "total_flos": 5 * 2**30 + 7, "train_loss": 1.234567,
               "train_mem_cpu_alloc_delta": 3 << 20, "epoch": 2}
    # transformers binds the module function as a method, so only the function is callable there
    from transformers.trainer_pt_utils import metrics_format

    assert o.metrics_format(metrics) == metrics_format(metrics)
    with caplog.at_level(logging.INFO, logger="hf_lite"):
        o.log_metrics("train", metrics)
    assert "  train_runtime             = 1:02:05.45" in caplog.text


def test_import_paths_scripts_use_exist_as_in_transformers():
    names = ["StoppingCriteria", "MaxLengthCriteria", "MaxTimeCriteria", "EosTokenCriteria", "StopStringCriteria",
             "LogitsProcessor", "TopKLogitsWarper", "TopPLogitsWarper", "TemperatureLogitsWarper", "MinPLogitsWarper",
             "RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor", "NoBadWordsLogitsProcessor",
             "get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup", "get_constant_schedule",
             "enable_full_determinism", "torch_distributed_zero_first", "DefaultDataCollator",
             "is_torch_available", "is_datasets_available", "is_tensorboard_available", "is_tokenizers_available"]
    for name in names:
        assert hasattr(transformers, name) and hasattr(hf_lite, name), name
    for module, names in ((hf_lite.utils, ["is_torch_available", "is_accelerate_available", "PushToHubMixin",
                                           "is_torch_cuda_available", "cached_file"]),
                          (hf_lite.integrations, ["is_tensorboard_available"])):
        upstream = {hf_lite.utils: transformers.utils, hf_lite.integrations: transformers.integrations}[module]
        for name in names:
            assert hasattr(upstream, name) and hasattr(module, name), name
            if name.startswith("is_"):
                assert getattr(module, name)() == getattr(upstream, name)(), name
    from hf_lite.training_args import HubStrategy
    from transformers.trainer_utils import HubStrategy as Theirs

    assert [s.value for s in HubStrategy] == [s.value for s in Theirs]


# ---------------------------------------------------------------------- AutoTokenizer options
@pytest.mark.parametrize("use_fast", [True, False])
@pytest.mark.parametrize("options", [dict(split_special_tokens=True), dict(split_special_tokens=False),
                                     dict(legacy=False), dict(padding_side="left", truncation_side="left",
                                                              model_max_length=6)])
def test_auto_tokenizer_options_match_transformers(trained_tokenizer_dir, use_fast, options):
    texts = ["def f(x): <|im_end|> return x<pad>", "<|im_start|>import os"]
    kwargs = dict(pad_token="<pad>", use_fast=use_fast, **options)
    ours = hf_lite.AutoTokenizer.from_pretrained(trained_tokenizer_dir, **kwargs)
    theirs = transformers.AutoTokenizer.from_pretrained(trained_tokenizer_dir, **kwargs)
    for call in (dict(), dict(padding=True, truncation=True)):
        assert ours(texts, **call)["input_ids"] == theirs(texts, **call)["input_ids"], (options, call)
    split = options.get("split_special_tokens", False)
    assert (ours.convert_tokens_to_ids("<|im_end|>") in ours(texts[0])["input_ids"]) is not split


def test_signatures_scripts_call_match_transformers(tmp_path, trained_tokenizer_dir):
    """Methods whose arguments hf-lite lacked (api_gap): now the same parameter names as transformers'."""
    pairs = [(hf_lite.Trainer.train, transformers.Trainer.train),
             (hf_lite.AutoTokenizer.register, transformers.AutoTokenizer.register),
             (hf_lite.BatchEncoding.to, transformers.BatchEncoding.to)]
    for ours, theirs in pairs:
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), ours
    # use_diff (write only non-default values) is not there: hf-lite writes the whole config
    assert list(inspect.signature(hf_lite.PretrainedConfig.to_json_file).parameters) == list(
        inspect.signature(transformers.PretrainedConfig.to_json_file).parameters)[:2]
    for lib in (hf_lite, transformers):
        tok = lib.AutoTokenizer.from_pretrained(trained_tokenizer_dir, pad_token="<pad>")
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
        tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]}, replace_extra_special_tokens=False)
        batch = tok(["a b", "c"], padding=True, return_tensors="pt", verbose=False).to("cpu", non_blocking=True)
        assert tok.pad(dict(batch), verbose=False, return_tensors="pt")["input_ids"].shape == batch["input_ids"].shape
        if lib is hf_lite:
            ours = (sorted(tok.all_special_tokens), batch["input_ids"].tolist())
        else:
            theirs = (sorted(tok.all_special_tokens), batch["input_ids"].tolist())
    assert ours == theirs
    config = hf_lite.LlamaConfig(vocab_size=10)
    config.to_json_file(json_file_path=tmp_path / "c.json")
    assert hf_lite.LlamaConfig.from_pretrained(tmp_path / "c.json").vocab_size == 10
    trainer = hf_lite.Trainer(trainer_model(), hf_lite.TrainingArguments(output_dir=str(tmp_path / "t"),
                                                                         report_to="none"))
    with pytest.raises(ValueError, match="trial: hf-lite's Trainer has no hyperparameter_search"):
        trainer.train(trial={"learning_rate": 1e-3})


def test_hf_argument_parser_parse_yaml_file_matches_transformers(tmp_path):
    (tmp_path / "args.yaml").write_text(f"output_dir: {tmp_path / 'out'}\nlearning_rate: 0.001\nmax_steps: 7\n"
                                        "report_to: none\nhub_strategy: checkpoint\n")
    (ours,) = hf_lite.HfArgumentParser(hf_lite.TrainingArguments).parse_yaml_file(tmp_path / "args.yaml")
    (theirs,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_yaml_file(tmp_path / "args.yaml")
    for name in ("output_dir", "learning_rate", "max_steps", "hub_strategy"):
        assert getattr(ours, name) == getattr(theirs, name), name
    (tmp_path / "bad.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="expected a YAML mapping"):
        hf_lite.HfArgumentParser(hf_lite.TrainingArguments).parse_yaml_file(tmp_path / "bad.yaml")


@pytest.mark.parametrize("use_fast", [True, False])
def test_added_vocab_and_cleanup_match_transformers(trained_tokenizer_dir, use_fast):
    seen = []
    for lib in (hf_lite, transformers):
        tok = lib.AutoTokenizer.from_pretrained(trained_tokenizer_dir, use_fast=use_fast, pad_token="<pad>")
        tok.add_tokens(["newtok"])
        tok.add_special_tokens({"additional_special_tokens": ["<x>"]})
        decoder = tok.added_tokens_decoder
        seen.append((tok.get_added_vocab(), {i: (t.content, t.special) for i, t in decoder.items()},
                     tok.clean_up_tokenization("Hello , world . It 's i 've we 're n't ?"), tok.added_tokens_encoder))
    assert seen[0] == seen[1]
    assert seen[0][0]["newtok"] == 800 and seen[0][1][801] == ("<x>", True)


def test_optimizer_cls_and_kwargs_trains_as_transformers(tmp_path, trained_tokenizer_dir):
    from hf_lite_testing import corpus_blocks

    pytest.importorskip("accelerate")
    blocks = corpus_blocks(trained_tokenizer_dir, n_blocks=12)
    ours = trainer_model()
    ours.save_pretrained(tmp_path / "init")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "init")
    common = dict(per_device_train_batch_size=4, max_steps=3, logging_steps=1, report_to="none", disable_tqdm=True,
                  save_strategy="no", weight_decay=0.1, seed=5)
    cls_kwargs = (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9})
    losses, groups = [], []
    for lib, model in ((transformers, theirs), (hf_lite, ours)):
        trainer = lib.Trainer(model=model, args=lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__),
                                                                      **common),
                              train_dataset=blocks, optimizer_cls_and_kwargs=cls_kwargs)
        trainer.train()
        assert isinstance(getattr(trainer.optimizer, "optimizer", trainer.optimizer), torch.optim.SGD)  # accelerate's
        losses.append([h["loss"] for h in trainer.state.log_history if "loss" in h])
        groups.append([(len(g["params"]), g["weight_decay"], g["momentum"]) for g in trainer.optimizer.param_groups])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and groups[1] == groups[0]
    with pytest.raises(RuntimeError, match="Passing both `optimizers` and `optimizer_cls_and_kwargs`"):
        hf_lite.Trainer(ours, hf_lite.TrainingArguments(output_dir=str(tmp_path / "x"), report_to="none"),
                        optimizers=(torch.optim.SGD(ours.parameters(), lr=0.1), None),
                        optimizer_cls_and_kwargs=cls_kwargs)


def test_model_init_trains_a_fresh_model_as_transformers(tmp_path, trained_tokenizer_dir):
    from hf_lite_testing import corpus_blocks

    pytest.importorskip("accelerate")
    blocks = corpus_blocks(trained_tokenizer_dir, n_blocks=8)
    trainer_model().save_pretrained(tmp_path / "init")
    common = dict(per_device_train_batch_size=4, max_steps=2, logging_steps=1, report_to="none", disable_tqdm=True,
                  save_strategy="no", seed=11, optim="adamw_torch")
    runs = []
    def model_init_of(lib):
        def init():  # no argument: transformers passes a trial to a one-argument model_init
            return lib.AutoModelForCausalLM.from_pretrained(tmp_path / "init")

        return init

    for lib in (transformers, hf_lite):
        init = model_init_of(lib)
        trainer = lib.Trainer(None, lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), **common), None,
                              blocks, None, None, init)  # model_init in transformers' position
        first, losses = trainer.model, []
        for _ in range(2):  # the second train() starts again from a fresh model: the same losses
            trainer.train()
            losses += [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert trainer.model is not first and len(losses) == 4
        runs.append(losses)
    assert runs[1] == pytest.approx(runs[0], rel=1e-6) and runs[1][:2] == runs[1][2:]
    with pytest.raises(RuntimeError, match="requires either a `model` or `model_init`"):
        hf_lite.Trainer(None, hf_lite.TrainingArguments(output_dir=str(tmp_path / "x"), report_to="none"))


def test_logging_helpers_match_transformers():
    import hf_lite.utils.logging as ours
    import transformers.utils.logging as theirs

    assert ours.get_log_levels_dict() == theirs.get_log_levels_dict()
    for lib in (ours, theirs):
        handler = logging.NullHandler()
        lib.add_handler(handler)
        assert handler in lib.get_logger().handlers
        lib.remove_handler(handler)
        assert handler not in lib.get_logger().handlers
        lib.disable_progress_bar()
        assert not lib.is_progress_bar_enabled() and lib.tqdm(range(3)).disable
        lib.enable_progress_bar()
        assert lib.is_progress_bar_enabled() and list(lib.tqdm(range(3), disable=True)) == [0, 1, 2]
        lib.captureWarnings(True)
        assert logging.getLogger("py.warnings").handlers
        lib.captureWarnings(False)
