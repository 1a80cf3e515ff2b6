"""The Trainer's state and events (the mechanism of transformers' ``trainer_callback.py``): ``TrainerState`` (what the
loop knows, saved as trainer_state.json), ``TrainerControl`` (the switches callbacks flip), ``TrainerCallback`` (every
event), ``CallbackHandler`` (calls each callback in order) and ``DefaultFlowCallback`` (decides from the strategies
when to log, evaluate, save and stop). The progress, printer and early-stopping callbacks are in
``_compat/trainer_callbacks.py``."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass

from .trainer_utils import IntervalStrategy, SaveStrategy

logger = logging.getLogger(__name__)


@dataclass
class TrainerState:
    """What the loop knows; one step is one optimizer update (``gradient_accumulation_steps`` micro-batches)."""

    epoch: float | None = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list = None
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict | None = None
    stateful_callbacks: list | dict | None = None

    def __post_init__(self):
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif not isinstance(self.stateful_callbacks, dict):  # callbacks -> their exported states, by class name
            states = {}
            for cb in self.stateful_callbacks:
                if not isinstance(cb, ExportableState):
                    raise TypeError(f"stateful_callbacks must inherit ExportableState, got {type(cb).__name__}")
                name = type(cb).__name__
                if name in states:
                    states[name] = (states[name] if isinstance(states[name], list) else [states[name]]) + [cb.state()]
                else:
                    states[name] = cb.state()
            self.stateful_callbacks = states

    def save_to_json(self, json_path: str) -> None:
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load_from_json(cls, json_path: str) -> TrainerState:
        with open(json_path, encoding="utf-8") as f:
            return cls(**json.loads(f.read()))

    def compute_steps(self, args, max_steps: int) -> None:
        """logging/eval/save steps given as a ratio (< 1) of the run become absolute step counts."""
        for kind in ("logging", "eval", "save"):
            steps = getattr(args, f"{kind}_steps")
            if steps is not None:
                setattr(self, f"{kind}_steps", math.ceil(max_steps * steps) if steps < 1 else steps)


class ExportableState:
    """A callback whose ``state()`` is saved in trainer_state.json and restored with ``from_state``."""

    def state(self) -> dict:
        raise NotImplementedError("You must implement a `state` function to utilize this class.")

    @classmethod
    def from_state(cls, state):
        instance = cls(**state["args"])
        for k, v in state["attributes"].items():
            setattr(instance, k, v)
        return instance


@dataclass
class TrainerControl(ExportableState):
    """Switches the callbacks flip; ``should_log/evaluate/save`` are reset at each step's beginning."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def state(self) -> dict:
        return {"args": dataclasses.asdict(self), "attributes": {}}


class TrainerCallback:
    """Override any event; each gets ``(args, state, control, **kwargs)`` with model, processing_class, optimizer,
    lr_scheduler, train_dataloader, eval_dataloader (plus ``metrics`` or ``logs`` where they apply) and may return
    a modified ``control``.

    Order within one optimizer step: on_step_begin, then per micro-batch on_substep_end (all but the last),
    on_pre_optimizer_step, on_optimizer_step, on_step_end, then on_log / on_evaluate / on_save as the flow decides.
    Around them: on_init_end, on_train_begin, on_epoch_begin ... on_epoch_end, on_train_end; on_prediction_step
    per evaluation batch, on_predict after ``Trainer.predict``, on_push_begin before each hub push."""

    def on_init_end(self, args, state, control, **kwargs): ...
    def on_train_begin(self, args, state, control, **kwargs): ...
    def on_train_end(self, args, state, control, **kwargs): ...
    def on_epoch_begin(self, args, state, control, **kwargs): ...
    def on_epoch_end(self, args, state, control, **kwargs): ...
    def on_step_begin(self, args, state, control, **kwargs): ...
    def on_pre_optimizer_step(self, args, state, control, **kwargs): ...
    def on_optimizer_step(self, args, state, control, **kwargs): ...
    def on_substep_end(self, args, state, control, **kwargs): ...
    def on_step_end(self, args, state, control, **kwargs): ...
    def on_evaluate(self, args, state, control, **kwargs): ...
    def on_predict(self, args, state, control, metrics, **kwargs): ...
    def on_save(self, args, state, control, **kwargs): ...
    def on_log(self, args, state, control, **kwargs): ...
    def on_prediction_step(self, args, state, control, **kwargs): ...
    def on_push_begin(self, args, state, control, **kwargs): ...


EVENTS = [name for name in vars(TrainerCallback) if name.startswith("on_")]


class CallbackHandler(TrainerCallback):
    """Calls every callback in order for each event, resetting the control switches the event owns."""

    def __init__(self, callbacks, model, processing_class, optimizer, lr_scheduler):
        self.callbacks = []
        for cb in callbacks:
            self.add_callback(cb)
        self.model, self.processing_class = model, processing_class
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.train_dataloader = self.eval_dataloader = None
        if not any(isinstance(cb, DefaultFlowCallback) for cb in self.callbacks):
            logger.warning("The Trainer has no DefaultFlowCallback: nothing will decide when to log, evaluate or save. "
                           "Callbacks: %s", self.callback_list)

    def add_callback(self, callback) -> None:
        cb = callback() if isinstance(callback, type) else callback
        if type(cb) in [type(c) for c in self.callbacks]:
            logger.warning("Adding a second %s to the Trainer's callbacks: %s", type(cb).__name__, self.callback_list)
        self.callbacks.append(cb)

    def pop_callback(self, callback):
        for cb in self.callbacks:
            if (isinstance(callback, type) and isinstance(cb, callback)) or cb is callback:
                self.callbacks.remove(cb)
                return cb
        return None

    def remove_callback(self, callback) -> None:
        self.pop_callback(callback)

    @property
    def callback_list(self) -> str:
        return ", ".join(type(cb).__name__ for cb in self.callbacks)

    def call_event(self, event, args, state, control, **kwargs):
        for callback in self.callbacks:
            result = getattr(callback, event)(
                args,
                state,
                control,
                model=self.model,
                processing_class=self.processing_class,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **kwargs,
            )
            if result is not None:  # a callback may return nothing when it changes nothing
                control = result
        return control


# The switches an event resets before the callbacks see it (transformers' CallbackHandler does it per event method).
_RESETS = {"on_train_begin": ("should_training_stop",), "on_epoch_begin": ("should_epoch_stop",),
           "on_step_begin": ("should_log", "should_evaluate", "should_save"), "on_evaluate": ("should_evaluate",),
           "on_save": ("should_save",), "on_log": ("should_log",)}


def _handler_event(name):
    def event(self, args, state, control, **kwargs):
        for switch in _RESETS.get(name, ()):
            setattr(control, switch, False)
        return self.call_event(name, args, state, control, **kwargs)

    event.__name__ = name
    return event


for _name in EVENTS:
    setattr(CallbackHandler, _name, _handler_event(_name))


class DefaultFlowCallback(TrainerCallback):
    """Decides from the strategies when to log, evaluate, save and stop."""

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if args.logging_strategy == IntervalStrategy.STEPS and step % state.logging_steps == 0:
            control.should_log = True
        eval_by_steps = args.eval_strategy == IntervalStrategy.STEPS and args.eval_delay <= step
        if eval_by_steps and step % state.eval_steps == 0:
            control.should_evaluate = True
        if args.save_strategy == SaveStrategy.STEPS and state.save_steps > 0 and step % state.save_steps == 0:
            control.should_save = True
        if step >= state.max_steps:
            control.should_training_stop = True
            # A final evaluation/save when the last step is not on the interval (transformers 5).
            if eval_by_steps and step % state.eval_steps != 0:
                control.should_evaluate = True
            if args.save_strategy == SaveStrategy.STEPS:
                control.should_save = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if args.logging_strategy == IntervalStrategy.EPOCH:
            control.should_log = True
        if args.eval_strategy == IntervalStrategy.EPOCH and args.eval_delay <= state.epoch:
            control.should_evaluate = True
        if args.save_strategy == SaveStrategy.EPOCH:
            control.should_save = True
        return control
