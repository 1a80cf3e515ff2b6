"""Hub uploads side by side with transformers, without a network: ``huggingface_hub.HfApi``'s ``create_repo``,
``create_branch``, ``create_commit`` and ``upload_folder`` (and ``ModelCard.load``, which finds no card) are replaced
by recorders, the same push runs on transformers and on hf-lite, and the recorded calls, the uploaded files' names
and (for weights) their tensors are compared.

Mirrors transformers' tests/utils/test_hub_utils.py push cases, tests/test_modeling_common.py / test_configuration_
common.py / test_tokenization_common.py ``test_push_to_hub*`` and tests/trainer/test_trainer.py's
``TrainerIntegrationWithHubTester`` (every_save, checkpoint, all_checkpoints, end), on recorded calls instead of the
staging hub."""

import concurrent.futures
import fnmatch
import io
import json
import os

import hf_lite
import huggingface_hub
import pytest
import torch
from hf_lite.training_args import HubStrategy
from hf_lite_testing import corpus_blocks, make_model, trainer_model
from huggingface_hub.errors import EntryNotFoundError
from safetensors.torch import load
from tokenizers import Tokenizer

transformers = pytest.importorskip("transformers")


def _content(name: str, data: bytes):
    """What a file says: tensors for weights, parsed JSON for JSON, the text's YAML tags for the card, else bytes."""
    if name.endswith(".safetensors"):
        return load(data)
    if name == "README.md":
        return "README.md"  # each library writes its own card text; the tags are compared separately
    if name.endswith(".json"):
        return json.loads(data)
    return data


class HubRecorder:
    """The hub as a list of calls; each upload keeps the uploaded files' contents (read when the call is made)."""

    def __init__(self):
        self.calls = []

    def install(self, monkeypatch):
        recorder = self

        def create_repo(api, repo_id, **kwargs):
            recorder.calls.append(("create_repo", repo_id, kwargs))
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id if '/' in repo_id else 'me/' + repo_id}")

        def create_branch(api, repo_id, **kwargs):
            recorder.calls.append(("create_branch", repo_id, kwargs))

        def create_commit(api, repo_id, operations, **kwargs):
            files = {}
            for op in operations:
                with open(op.path_or_fileobj, "rb") as f:
                    files[op.path_in_repo] = f.read()
            recorder.calls.append(("create_commit", repo_id, kwargs, files))
            return "commit"

        def upload_folder(api, *, repo_id, folder_path, **kwargs):
            files = {}
            for root, _, names in os.walk(folder_path):
                for name in names:
                    rel = os.path.relpath(os.path.join(root, name), folder_path).replace(os.sep, "/")
                    if not any(fnmatch.fnmatch(rel, p) for p in kwargs.get("ignore_patterns") or []):
                        with open(os.path.join(root, name), "rb") as f:
                            files[rel] = f.read()
            recorder.calls.append(("upload_folder", repo_id, kwargs, files))
            if kwargs.get("run_as_future"):
                future = concurrent.futures.Future()
                future.set_result("commit")
                return future
            return "commit"

        def no_card(cls, *args, **kwargs):
            raise EntryNotFoundError("no README.md in the repo")

        for name, fn in [("create_repo", create_repo), ("create_branch", create_branch),
                         ("create_commit", create_commit), ("upload_folder", upload_folder)]:
            monkeypatch.setattr(huggingface_hub.HfApi, name, fn)
        monkeypatch.setattr(huggingface_hub.ModelCard, "load", classmethod(no_card))
        return self

    def take(self):
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def hub(monkeypatch):
    return HubRecorder().install(monkeypatch)


def _card_tags(files: dict) -> list:
    text = files["README.md"].decode()
    return huggingface_hub.ModelCard(text).data.tags


def assert_same_calls(theirs, ours, ignore_files=()):
    """Same calls in the same order with the same arguments, the same files (by name) with the same contents."""
    assert [c[:2] for c in ours] == [c[:2] for c in theirs]
    for t, o in zip(theirs, ours):
        assert o[2] == t[2], (t[0], t[2], o[2])
        if len(t) > 3:
            t_files = {k: v for k, v in t[3].items() if k not in ignore_files}
            o_files = {k: v for k, v in o[3].items() if k not in ignore_files}
            assert sorted(o_files) == sorted(t_files)
            for name in t_files:
                if name.endswith(".safetensors"):
                    t_tensors, o_tensors = _content(name, t_files[name]), _content(name, o_files[name])
                    assert sorted(o_tensors) == sorted(t_tensors), name
                    for key in t_tensors:
                        assert torch.equal(o_tensors[key], t_tensors[key]), (name, key)
            if "README.md" in t_files:
                assert _card_tags(o_files) == _card_tags(t_files)


def _pair(tmp_path, kind="llama"):
    """The same weights in both libraries, each model built in module order (transformers' ``from_pretrained``
    leaves its state dict in the checkpoint's sorted order, and the shard split follows the order)."""
    ours = make_model(kind)
    ours.save_pretrained(tmp_path / "init")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "init")
    theirs = transformers.AutoModelForCausalLM.from_config(config).eval()
    theirs.load_state_dict(ours.state_dict())
    return theirs, ours


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_model_push_to_hub_matches_transformers(tmp_path, hub, kind):
    theirs, ours = _pair(tmp_path, kind)
    kwargs = dict(commit_message="tiny", commit_description="a tiny model", private=True, token="hf_x",
                  revision="dev", create_pr=True, max_shard_size="20KB", tags=["tiny", "test"])
    theirs.push_to_hub("org/tiny", **kwargs)
    expected = hub.take()
    ours.push_to_hub("org/tiny", **kwargs)
    got = hub.take()
    assert [c[0] for c in got] == ["create_repo", "create_branch", "create_commit"]
    assert_same_calls(expected, got)
    files = got[-1][3]
    assert "model.safetensors.index.json" in files and len([f for f in files if f.startswith("model-")]) > 1
    assert _card_tags(files) == ["tiny", "test"]
    # Defaults: "Upload model" by class name, main branch, one file, the repo in the user's namespace.
    theirs.push_to_hub("tiny")
    expected = hub.take()
    ours.push_to_hub("tiny")
    got = hub.take()
    assert_same_calls(expected, got)
    assert got[-1][1] == "me/tiny" and sorted(got[-1][3]) == ["README.md", "config.json", "generation_config.json",
                                                              "model.safetensors"]


def test_model_tags_go_into_the_card_as_transformers(tmp_path, hub):
    theirs, ours = _pair(tmp_path)
    for model in (theirs, ours):
        model.add_model_tags(["trl", "sft"])
        model.add_model_tags("trl")
        model.push_to_hub("org/tagged", tags="extra")
    theirs_calls, ours_calls = hub.calls[:2], hub.calls[2:]
    assert_same_calls(theirs_calls, ours_calls)
    assert ours.model_tags == ["trl", "sft"] and _card_tags(ours_calls[-1][3]) == ["trl", "sft", "extra"]


def test_save_pretrained_push_to_hub_commits_what_the_save_changed_as_transformers(tmp_path, hub):
    theirs, ours = _pair(tmp_path)
    for side, model in (("t", theirs), ("o", ours)):
        directory = tmp_path / side
        directory.mkdir()
        (directory / "notes.txt").write_text("kept, not uploaded")
        os.utime(directory / "notes.txt", (1, 1))
        model.save_pretrained(directory, push_to_hub=True, repo_id="org/saved", commit_message="save",
                              private=False, create_pr=True)
    theirs_calls, ours_calls = hub.calls[:2], hub.calls[2:]
    assert_same_calls(theirs_calls, ours_calls)
    assert "notes.txt" not in ours_calls[-1][3] and (tmp_path / "o" / "notes.txt").exists()
    hub.take()
    # Without repo_id: the directory's name; without push_to_hub, hub kwargs are an error (transformers ignores them).
    theirs.save_pretrained(tmp_path / "named", push_to_hub=True)
    ours.save_pretrained(tmp_path / "named2", push_to_hub=True)
    (_, t_repo, _), (_, o_repo, _) = hub.calls[0], hub.calls[2]
    assert (t_repo, o_repo) == ("named", "named2")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['repo_id'\]"):
        ours.save_pretrained(tmp_path / "x", repo_id="org/x")


def test_config_and_generation_config_push_to_hub_match_transformers(tmp_path, hub):
    theirs, ours = _pair(tmp_path)
    for obj_t, obj_o in ((theirs.config, ours.config), (theirs.generation_config, ours.generation_config)):
        obj_t.push_to_hub("org/cfg", token="hf_x", commit_description="d")
        expected = hub.take()
        obj_o.push_to_hub("org/cfg", token="hf_x", commit_description="d")
        got = hub.take()
        assert_same_calls(expected, got)
        assert got[-1][2]["commit_message"] == "Upload config"
    # The config's keys as transformers reads them back.
    config = json.loads(got[-1][3]["generation_config.json"])
    assert config["bos_token_id"] == theirs.generation_config.bos_token_id


def _tokenizer_pair(tmp_path, trained_tokenizer_dir):
    tok = Tokenizer.from_file(os.path.join(trained_tokenizer_dir, "tokenizer.json"))
    kw = dict(eos_token="<|endoftext|>", pad_token="<pad>")
    return (transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **kw),
            hf_lite.PreTrainedTokenizerFast(tokenizer_object=tok, **kw))


def test_tokenizer_push_to_hub_matches_transformers(tmp_path, hub, trained_tokenizer_dir):
    theirs, ours = _tokenizer_pair(tmp_path, trained_tokenizer_dir)
    theirs.push_to_hub("org/tok", private=True, revision="refs/pr/1")
    expected = hub.take()
    ours.push_to_hub("org/tok", private=True, revision="refs/pr/1")
    got = hub.take()
    assert [c[0] for c in got] == ["create_repo", "create_commit"]  # a PR ref needs no branch
    assert [c[:3] for c in got] == [c[:3] for c in expected]
    assert got[-1][2]["commit_message"] == "Upload tokenizer"
    t_files, o_files = expected[-1][3], got[-1][3]
    assert {"README.md", "tokenizer.json", "tokenizer_config.json"} <= set(o_files) & set(t_files)
    assert json.loads(o_files["tokenizer.json"])["model"] == json.loads(t_files["tokenizer.json"])["model"]
    back = transformers.PreTrainedTokenizerFast(tokenizer_file=None, tokenizer_object=Tokenizer.from_str(
        o_files["tokenizer.json"].decode()))
    assert back("def f(x): return x")["input_ids"] == theirs("def f(x): return x")["input_ids"]
    # save_pretrained(push_to_hub=True): the token goes to create_repo and the commit, as in transformers.
    for side, tok in (("t", theirs), ("o", ours)):
        tok.save_pretrained(tmp_path / side, push_to_hub=True, repo_id="org/tok", token="hf_x")
    (t_repo, t_commit), (o_repo, o_commit) = hub.calls[:2], hub.calls[2:]
    assert o_repo == t_repo and o_commit[2] == t_commit[2]


# ---------------------------------------------------------------------- the Trainer
@pytest.fixture(scope="module")
def blocks(trained_tokenizer_dir):
    return corpus_blocks(trained_tokenizer_dir, n_blocks=16)


def _trainer_pair(tmp_path, blocks, tokenizer_dir, **kw):
    pytest.importorskip("accelerate", reason="transformers' Trainer requires accelerate (the dev group has it)")
    ours = trainer_model()
    ours.save_pretrained(tmp_path / "init")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "init")
    common = dict(per_device_train_batch_size=4, max_steps=4, save_steps=2, logging_steps=1, report_to="none",
                  seed=7, disable_tqdm=True, learning_rate=5e-3, push_to_hub=True, hub_token="hf_x",
                  hub_private_repo=True, optim="adamw_torch")
    common.update(kw)
    t_tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir, pad_token="<pad>")
    o_tok = hf_lite.AutoTokenizer.from_pretrained(tokenizer_dir, pad_token="<pad>")
    t = transformers.Trainer(model=theirs, args=transformers.TrainingArguments(output_dir=str(tmp_path / "run"),
                                                                                **common),
                             train_dataset=blocks, processing_class=t_tok)
    o = hf_lite.Trainer(ours, hf_lite.TrainingArguments(output_dir=str(tmp_path / "run2"), **common),
                        train_dataset=blocks, processing_class=o_tok)
    return t, o


def _trainer_calls(hub, trainer):
    trainer.train()
    trainer.push_to_hub(commit_message="done", tags="tiny")
    return hub.take()


def _same_weights(t_files, o_files):
    for name in (n for n in t_files if n.endswith(".safetensors")):
        t, o = _content(name, t_files[name]), _content(name, o_files[name])
        assert sorted(o) == sorted(t)
        for key in t:
            torch.testing.assert_close(o[key], t[key], rtol=1e-5, atol=1e-6)


# transformers pickles the arguments (training_args.bin), hf-lite writes them as JSON (training_args.json); hf-lite's
# tokenizer also writes special_tokens_map.json (transformers 5 folds it into tokenizer_config.json).
_OWN = ("training_args.bin", "training_args.json", "special_tokens_map.json")


def _names(files):
    return sorted(n for n in files if n.rsplit("/", 1)[-1] not in _OWN)


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint", "all_checkpoints", "end"])
def test_trainer_pushes_as_transformers(tmp_path, hub, blocks, trained_tokenizer_dir, strategy):
    t, o = _trainer_pair(tmp_path, blocks, trained_tokenizer_dir, hub_model_id="org/run", hub_strategy=strategy)
    assert [c[:3] for c in hub.take()] == [("create_repo", "org/run", {"token": "hf_x", "private": True,
                                                                       "exist_ok": True})] * 2
    expected, got = _trainer_calls(hub, t), _trainer_calls(hub, o)
    assert [c[:2] for c in got] == [c[:2] for c in expected]
    for t_call, o_call in zip(expected, got):
        assert o_call[2] == t_call[2]
        assert _names(o_call[3]) == _names(t_call[3])
        _same_weights(t_call[3], o_call[3])
    messages = [c[2]["commit_message"] for c in got]
    pushed = {"every_save": 2, "checkpoint": 4, "all_checkpoints": 4, "end": 0}[strategy]
    assert len(messages) == pushed + 1 and messages[-1] == "done"
    if strategy == "checkpoint":
        assert [c[2].get("path_in_repo") for c in got[:2]] == [None, "last-checkpoint"]
    assert "training_args.json" in got[-1][3] and "README.md" in got[-1][3]
    assert json.loads(got[-1][3]["training_args.json"])["hub_token"] == "<HUB_TOKEN>"


def test_trainer_save_model_pushes_and_init_hf_repo_defaults_to_the_output_dir(tmp_path, hub, blocks,
                                                                              trained_tokenizer_dir):
    t, o = _trainer_pair(tmp_path, blocks, trained_tokenizer_dir, max_steps=1, save_strategy="no")
    t_repo, o_repo = hub.take()
    assert (t_repo[1], o_repo[1]) == ("run", "run2")
    seen = []

    class OnPush(hf_lite.TrainerCallback):
        def on_push_begin(self, args, state, control, **kwargs):
            seen.append(state.global_step)

    o.add_callback(OnPush)
    for trainer in (t, o):
        trainer.train()
        trainer.save_model()
    t_calls, o_calls = hub.calls[:1], hub.calls[1:]
    assert [c[2] for c in o_calls] == [c[2] for c in t_calls]
    assert o_calls[0][2]["commit_message"] == "Model save" and seen == [1]
    assert _names(o_calls[0][3]) == _names(t_calls[0][3])
    args = hf_lite.TrainingArguments(output_dir=str(tmp_path / "a")).set_push_to_hub("org/m", strategy="end")
    assert (args.push_to_hub, args.hub_model_id, args.hub_strategy) == (True, "org/m", HubStrategy.END)
    with pytest.raises(ValueError, match="'sometimes' is not a valid HubStrategy"):
        hf_lite.TrainingArguments(output_dir=str(tmp_path / "a"), hub_strategy="sometimes")


def test_push_to_hub_keeps_transformers_4_arguments(tmp_path, hub, monkeypatch):
    model = make_model("llama")
    monkeypatch.chdir(tmp_path)
    model.push_to_hub("org/local", use_temp_dir=False, safe_serialization=False)
    (_, _, _), (_, repo, kwargs, files) = hub.take()
    assert repo == "org/local" and (tmp_path / "local" / "pytorch_model.bin").exists()
    assert sorted(files) == ["README.md", "config.json", "generation_config.json", "pytorch_model.bin"]
    state = torch.load(io.BytesIO(files["pytorch_model.bin"]), weights_only=True)
    assert torch.equal(state["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def _card_without_versions(text: str) -> str:
    return text.split("### Framework versions")[0]


@pytest.mark.parametrize("card_kwargs", [
    dict(model_name="tiny", tags="x", finetuned_from="org/base", dataset="my_data", license="mit", language="en"),
    dict(tasks="text-generation", dataset_tags=["wikitext", "c4"], dataset=["WikiText", "C4"], tags=["a", "b"]),
    dict(),
])
def test_create_model_card_writes_transformers_card(tmp_path, blocks, trained_tokenizer_dir, card_kwargs):
    pytest.importorskip("accelerate", reason="transformers' Trainer requires accelerate (the dev group has it)")

    def accuracy(pred):
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    ours = trainer_model()
    ours.save_pretrained(tmp_path / "init")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "init")
    common = dict(per_device_train_batch_size=4, max_steps=4, eval_strategy="steps", eval_steps=2, logging_steps=1,
                  report_to="none", disable_tqdm=True, save_strategy="no", gradient_accumulation_steps=2,
                  warmup_steps=1, optim="adamw_torch", seed=3)
    cards = []
    for lib, model, name in ((transformers, theirs, "t"), (hf_lite, ours, "o")):
        args = lib.TrainingArguments(output_dir=str(tmp_path / name / "run"), **common)
        trainer = lib.Trainer(model=model, args=args, train_dataset=blocks, eval_dataset=blocks[:8],
                              compute_metrics=accuracy)
        trainer.train()
        trainer.create_model_card(**card_kwargs)
        cards.append((tmp_path / name / "run" / "README.md").read_text())
    theirs_card, ours_card = cards
    assert _card_without_versions(ours_card) == _card_without_versions(theirs_card)
    assert "| Training Loss | Epoch | Step | Validation Loss | Accuracy |" in ours_card
    assert "### Framework versions\n\n- hf-lite" in ours_card


def test_pipeline_push_to_hub_matches_transformers(tmp_path, hub, trained_tokenizer_dir):
    theirs, ours = _pair(tmp_path)
    t_tok, o_tok = _tokenizer_pair(tmp_path, trained_tokenizer_dir)
    transformers.pipeline("text-generation", model=theirs, tokenizer=t_tok).push_to_hub("org/pipe")
    expected = hub.take()
    hf_lite.pipeline("text-generation", model=ours, tokenizer=o_tok).push_to_hub("org/pipe")
    got = hub.take()
    assert [c[:3] for c in got] == [c[:3] for c in expected]
    assert got[-1][2]["commit_message"] == "Upload TextGenerationPipeline"
    t_files, o_files = expected[-1][3], got[-1][3]
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json"} <= set(o_files) & set(t_files)
    weights = "model.safetensors"
    _same_weights({weights: t_files[weights]}, {weights: o_files[weights]})
