"""TrainingArguments (defaults, invalid values and combinations rejected at construction, naming the fields) and
HfArgumentParser (an argparse CLI with --help, bool flags, lists, JSON files).

Mirrors transformers' tests/trainer/test_trainer.py argument checks (test_load_best_model_at_end_*,
test_training_arguments_are_left_untouched) and tests/utils/test_hf_argparser.py (test_basic, test_with_default_bool,
test_with_enum, test_with_list, test_with_optional, test_parse_dict, test_parse_json), against transformers'
HfArgumentParser on the same dataclasses."""

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass, field
from enum import Enum

import pytest
import transformers
from hf_lite import HfArgumentParser, TrainingArguments


def test_defaults_are_transformers_defaults():
    theirs = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments)}
    ours = dataclasses.fields(TrainingArguments)
    hf_lite_only = {"warmup_ratio"}  # transformers 4's name, gone in 5.24
    shared = [f for f in ours if f.name not in hf_lite_only]
    assert [f.name for f in shared if f.name not in theirs] == []
    for f in shared:
        their = theirs[f.name]
        default = their.default_factory() if their.default_factory is not dataclasses.MISSING else their.default
        mine = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert mine == default, f.name


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch"),
            "load_best_model_at_end requires the save and eval strategy to match.*eval_strategy='steps'.*save_strategy",
        ),
        (
            dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=3, save_steps=5),
            "save_steps=5 to be a round multiple of eval_steps=3",
        ),
        (dict(fp16=True, bf16=True), "fp16=True and bf16=True"),
        (dict(save_strategy="best"), "save_strategy='best'.*eval_strategy='no'"),
        (dict(lr_scheduler_type="cosine_with_restarts"), "'cosine_with_restarts' is not a valid SchedulerType"),
        (dict(eval_strategy="sometimes"), "'sometimes' is not a valid IntervalStrategy"),
        (dict(optim="sgd"), "'sgd' is not a valid OptimizerNames"),
        (dict(per_device_train_batch_size=0), "per_device_train_batch_size=0 must be a positive integer"),
        (dict(gradient_accumulation_steps=1.5), "gradient_accumulation_steps=1.5"),
        (dict(max_steps=0), "max_steps=0"),
        (dict(learning_rate=-1.0), "learning_rate=-1.0"),
        (dict(adam_beta2=1.0), r"adam_beta2=1.0 must be in \[0, 1\)"),
        (dict(warmup_steps=-1), "warmup_steps=-1"),
        (dict(warmup_steps=2.5), "warmup_steps=2.5 must be an integer"),
        (dict(warmup_steps=3, warmup_ratio=0.1), "warmup_steps=3 and warmup_ratio=0.1"),
        (dict(logging_steps=2.5), "logging_steps=2.5 must be an integer"),
        (dict(save_steps=0), "save_strategy='steps' requires a positive save_steps"),
        (dict(save_total_limit=0), "save_total_limit=0"),
        (dict(report_to="wandb"), r"report_to='wandb': unknown integration\(s\) \['wandb'\]"),
        (dict(include_num_input_tokens_seen="some"), "include_num_input_tokens_seen='some'"),
        (dict(ddp_backend="mpi"), "ddp_backend='mpi'"),
        (dict(dataloader_prefetch_factor=2), "dataloader_prefetch_factor"),
        (dict(lr_scheduler_kwargs="{not json"), "lr_scheduler_kwargs="),
        (dict(gradient_checkpointing=True, activation_checkpointing=False), "gradient_checkpointing=True and"),
        (dict(log_level="loud"), "log_level='loud'"),
    ],
)
def test_invalid_arguments_raise_naming_the_fields(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingArguments(output_dir=str(tmp_path), **kwargs)


def test_derived_values(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        eval_strategy="steps",
        logging_steps=7,
        load_best_model_at_end=True,
        save_steps=7,
        lr_scheduler_kwargs='{"num_cycles": 1.0}',
    )
    assert args.eval_steps == 7 and args.metric_for_best_model == "loss" and args.greater_is_better is False
    assert args.lr_scheduler_kwargs == {"num_cycles": 1.0}
    assert TrainingArguments(output_dir=str(tmp_path), metric_for_best_model="accuracy").greater_is_better is True
    assert TrainingArguments(output_dir=str(tmp_path), warmup_steps=0.1).get_warmup_steps(25) == 3
    assert TrainingArguments(output_dir=str(tmp_path), warmup_ratio=0.1).get_warmup_steps(25) == 3
    assert TrainingArguments(output_dir=str(tmp_path), warmup_steps=4).get_warmup_steps(25) == 4
    ga = TrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=True)
    assert ga.activation_checkpointing is True and ga.gradient_checkpointing is True
    assert TrainingArguments().output_dir == "trainer_output"
    assert json.loads(args.to_json_string())["eval_strategy"] == "steps"


class BasicEnum(Enum):
    titi = "titi"
    toto = "toto"


@dataclass
class ScriptArguments:
    foo: int = field(metadata={"help": "The foo to use."})
    bar: float = 3.5
    baz: str = field(default="toto", metadata={"help": "help message"})
    flag: bool = False
    on: bool = True
    opt: int | None = None
    choice: BasicEnum = BasicEnum.toto
    numbers: list[int] = field(default_factory=lambda: [1, 2])


@pytest.mark.parametrize(
    "argv",
    [
        ["--foo", "1"],
        ["--foo", "2", "--bar", "0.5", "--baz", "q", "--flag", "--no_on", "--opt", "4", "--choice", "titi"],
        ["--foo", "3", "--flag", "false", "--on", "true", "--numbers", "5", "6", "7"],
        ["--foo", "4", "--no-on", "--flag", "yes"],
    ],
)
def test_parse_args_as_transformers_does(argv):
    (ours,) = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses(argv, look_for_args_file=False)
    (theirs,) = transformers.HfArgumentParser(ScriptArguments).parse_args_into_dataclasses(
        argv, look_for_args_file=False
    )
    assert ours == theirs


def test_parser_errors_and_extra_arguments():
    parser = HfArgumentParser(ScriptArguments)
    with pytest.raises(ValueError, match=r"not used by the HfArgumentParser: \['--oops'\]"):
        parser.parse_args_into_dataclasses(["--foo", "1", "--oops"], look_for_args_file=False)
    args, rest = parser.parse_args_into_dataclasses(
        ["--foo", "1", "--oops"], return_remaining_strings=True, look_for_args_file=False
    )
    assert args.foo == 1 and rest == ["--oops"]
    with pytest.raises(SystemExit):  # --foo is required; --choice must be one of the enum's values
        parser.parse_args_into_dataclasses(["--choice", "titi"], look_for_args_file=False)
    with pytest.raises(ValueError, match=r"not used by the HfArgumentParser: \['nope'\]"):
        parser.parse_dict({"foo": 1, "nope": 2})


def test_training_arguments_from_the_command_line_and_a_json_file(tmp_path):
    argv = [
        "--output_dir",
        str(tmp_path),
        "--max_steps",
        "9",
        "--gradient_accumulation_steps",
        "2",
        "--bf16",
        "--report_to",
        "jsonl",
        "--lr_scheduler_type",
        "cosine",
        "--no_remove_unused_columns",
        "--label_names",
        "labels",
        "other",
    ]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv, look_for_args_file=False)
    assert (args.max_steps, args.gradient_accumulation_steps, args.bf16, args.report_to) == (9, 2, True, ["jsonl"])
    assert args.lr_scheduler_type == "cosine" and args.remove_unused_columns is False
    assert args.label_names == ["labels", "other"]
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path), "foo": 5, "max_steps": 3, "eval_strategy": "steps"}))
    script, train = HfArgumentParser([ScriptArguments, TrainingArguments]).parse_json_file(path)
    assert script.foo == 5 and train.max_steps == 3 and train.eval_steps == 500
    with pytest.raises(ValueError, match="load_best_model_at_end requires"):  # validation runs on parsed values too
        HfArgumentParser(TrainingArguments).parse_dict(
            {"load_best_model_at_end": True, "eval_strategy": "epoch", "save_strategy": "steps"}
        )


def test_help_lists_every_field_with_its_help_and_default():
    code = "from hf_lite import HfArgumentParser, TrainingArguments; HfArgumentParser(TrainingArguments).parse_args()"
    out = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for f in dataclasses.fields(TrainingArguments):
        assert f"--{f.name}" in out.stdout, f.name
    assert "Gradient clipping norm (0 disables clipping). (default: 1.0)" in " ".join(out.stdout.split())
