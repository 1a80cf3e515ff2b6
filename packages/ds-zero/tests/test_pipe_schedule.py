"""Pipeline schedules: DeepSpeed's tests/unit/runtime/pipe/test_pipe_schedule.py ported (our TrainSchedule
is written from 1F1B's closed forms, not DeepSpeed's parity tables, and must give the same instruction streams'
shape), then ours: every stage's stream of TrainSchedule and GPipeSchedule against an independent simulation
of the pipeline (each receive meets a send in the same tick, buffers are never reused while alive), and the
bubble of the ideal timeline."""

import pytest
from ds_zero.pipe import schedule, schedule_timeline
from ds_zero.pipe.timeline import gpipe_timeline, render_svg


def _count_type(cmds, classtype):
    return len([c for c in cmds if type(c) is classtype])


def _types(cmds):
    return [type(c) for c in cmds]


# --- upstream's cases, rewritten ------------------------------------------------------------------------------
def test_pipe_inference_schedule_singlestage():
    sched = schedule.InferenceSchedule(micro_batches=4, stages=1, stage_id=0)
    steps = list(sched)
    assert sched.num_micro_batches == 4 and len(steps) == 4
    for cmds in steps:  # load then forward, into the same buffer
        assert _types(cmds) == [schedule.LoadMicroBatch, schedule.ForwardPass]
        assert cmds[0].buffer_id == cmds[1].buffer_id


def test_pipe_train_schedule_singlestage():
    sched = schedule.TrainSchedule(micro_batches=4, stages=1, stage_id=0)
    steps = list(sched)
    assert len(steps) == 2 * sched.num_micro_batches
    for idx, cmds in enumerate(steps):
        if idx % 2:  # backward ticks; the last also reduces and steps
            assert type(cmds[0]) is schedule.BackwardPass and len(cmds) in (1, 4)
        else:
            assert _types(cmds) == [schedule.LoadMicroBatch, schedule.ForwardPass]
            assert cmds[0].buffer_id == cmds[1].buffer_id


@pytest.mark.parametrize("micro_batches", [1, 3, 8, 10])
def test_pipe_inference_schedule_firststage(micro_batches, stages=3):
    steps = list(schedule.InferenceSchedule(micro_batches=micro_batches, stages=stages, stage_id=0))
    assert len(steps) == micro_batches + stages - 1
    assert _types(steps[0]) == [schedule.LoadMicroBatch, schedule.ForwardPass]  # nothing to send yet
    assert steps[0][0].buffer_id == steps[0][1].buffer_id
    for idx, cmds in enumerate(steps[1:], start=1):
        if idx < micro_batches:  # load, forward, send the previous one
            assert len(cmds) == 3 and all(_count_type(cmds, t) == 1 for t in (
                schedule.LoadMicroBatch, schedule.ForwardPass, schedule.SendActivation))
        elif idx == micro_batches:
            assert _types(cmds) == [schedule.SendActivation]  # the last send
        else:
            assert cmds == []


@pytest.mark.parametrize("micro_batches", [1, 3, 8, 10])
def test_pipe_inference_schedule_midstage(micro_batches, stages=3):
    sched = schedule.InferenceSchedule(micro_batches=micro_batches, stages=stages, stage_id=1)
    steps = list(sched)
    assert len(steps) == micro_batches + stages - 1
    for idx, cmds in enumerate(steps):
        if idx < sched.stage or idx > sched.stage + micro_batches:
            assert cmds == []
        elif idx == sched.stage + micro_batches:
            assert _types(cmds) == [schedule.SendActivation]
        else:
            assert _count_type(cmds, schedule.LoadMicroBatch) == 0
            assert _count_type(cmds, schedule.ForwardPass) == 1 and _count_type(cmds, schedule.RecvActivation) == 1
            if idx > sched.stage:
                assert _count_type(cmds, schedule.SendActivation) == 1


@pytest.mark.parametrize("micro_batches", [1, 3, 8, 10])
def test_pipe_inference_schedule_laststage(micro_batches, stages=3):
    sched = schedule.InferenceSchedule(micro_batches=micro_batches, stages=stages, stage_id=2)
    steps = list(sched)
    assert len(steps) == micro_batches + stages - 1
    for idx, cmds in enumerate(steps):
        if idx < sched.stage or idx > sched.stage + micro_batches:
            assert cmds == []
        else:  # receive, load labels, forward; never send
            assert [_count_type(cmds, t) for t in (schedule.LoadMicroBatch, schedule.ForwardPass,
                                                   schedule.RecvActivation, schedule.SendActivation)] == [1, 1, 1, 0]


def test_pipe_schedule_firststage():
    sched = schedule.TrainSchedule(micro_batches=8, stages=3, stage_id=0)
    for cmds in sched:
        assert not {schedule.SendGrad, schedule.RecvActivation} & set(_types(cmds))
        for c in cmds:
            if isinstance(c, schedule.BufferOpInstruction):
                assert 0 <= c.buffer_id < sched.num_pipe_buffers()


def test_pipe_schedule_laststage():
    sched = schedule.TrainSchedule(stages=3, micro_batches=4, stage_id=2)
    steps = list(sched)
    assert len(steps) == 2 * (sched.micro_batches + sched.stages - 1)
    for cmds in steps:
        assert not {schedule.SendActivation, schedule.RecvGrad} & set(_types(cmds))


def test_pipe_stagequery():
    flags = [(schedule.TrainSchedule(stages=3, micro_batches=4, stage_id=s).is_first_stage,
              schedule.TrainSchedule(stages=3, micro_batches=4, stage_id=s).is_last_stage) for s in range(3)]
    assert flags == [(True, False), (False, False), (False, True)]


# --- ours -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [schedule.TrainSchedule, schedule.GPipeSchedule])
@pytest.mark.parametrize(("stages", "micro_batches"), [(1, 3), (2, 1), (2, 5), (3, 2), (4, 8), (5, 3)])
def test_streams_pair_sends_with_receives_and_respect_buffers(cls, stages, micro_batches):
    streams = [list(cls(micro_batches, stages, s)) for s in range(stages)]
    ticks = len(streams[0])
    assert all(len(st) == ticks for st in streams) and ticks == 2 * (micro_batches + stages - 1)
    alive = [dict() for _ in range(stages)]  # per stage: buffer -> micro-batch whose activations it holds
    done = {"F": [0] * stages, "B": [0] * stages}
    for t in range(ticks):
        for s in range(stages):
            cmds = streams[s][t]
            sends = [(type(c), c.buffer_id) for c in cmds if type(c) in (schedule.SendActivation, schedule.SendGrad)]
            # a SendActivation at tick t is received by stage s+1 at tick t; a SendGrad by stage s-1
            for kind, _ in sends:
                peer, want = (s + 1, schedule.RecvActivation) if kind is schedule.SendActivation \
                    else (s - 1, schedule.RecvGrad)
                assert _count_type(streams[peer][t], want) == 1, (t, s, kind)
            for c in cmds:
                if type(c) is schedule.ForwardPass:
                    assert c.buffer_id not in alive[s], (t, s)  # never overwrite a live micro-batch
                    alive[s][c.buffer_id] = done["F"][s]
                    done["F"][s] += 1
                if type(c) is schedule.BackwardPass:
                    assert alive[s].pop(c.buffer_id) == done["B"][s]  # backwards in forward order
                    done["B"][s] += 1
                    if s < stages - 1:  # its output's gradient came from stage s+1, which already did this one
                        assert done["B"][s + 1] > done["B"][s] - 1
    assert done["F"] == [micro_batches] * stages and done["B"] == [micro_batches] * stages
    assert [type(c) for c in streams[0][-1][-3:]] == [schedule.ReduceTiedGrads, schedule.ReduceGrads,
                                                      schedule.OptimizerStep]


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 4), (4, 8), (4, 2), (8, 16)])
def test_ideal_timeline_bubble_and_in_flight_micro_batches(stages, micro_batches):
    t = schedule_timeline(stages, micro_batches)
    expected = (stages - 1) / (micro_batches + stages - 1)
    assert t["bubble"] == pytest.approx([expected] * stages) and t["expected"] == pytest.approx(expected)
    for s, row in enumerate(t["rows"]):
        in_flight, peak = 0, 0
        for _, _, kind, _ in row:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(stages - s, micro_batches)  # 1F1B: p - s on stage s
    g = gpipe_timeline(stages, micro_batches)
    assert g["bubble"] == pytest.approx([expected] * stages)  # the same bubble ...
    peaks = []
    for row in g["rows"]:
        in_flight, peak = 0, 0
        for _, _, kind, _ in row:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        peaks.append(peak)
    assert peaks == [micro_batches] * stages  # ... but every micro-batch alive at the turn
    svg = render_svg(t, title="1F1B")
    assert svg.startswith("<svg") and svg.count('fill="#4e79a7"') == stages * micro_batches + 1
