"""ZeRO-Infinity (NVMe offload): DeepSpeed's tests/unit/ops/aio/test_aio.py read/write/queue/offset cases ported to
our AsyncIOHandle (O_DIRECT on this filesystem), then the engine at stage 3 with optimizer states, and parameters,
swapped to ``nvme_path``: the loss curve is the non-offloaded engine's, the swap files exist during training
and hold the states (read straight from disk they equal the baseline's fp32 master and Adam moments), the next
sub-group's read is issued before the current one is stepped, parameters are prefetched, engine-side and host
bytes are the buffers only, a checkpoint resumes bitwise, the files are gone after destroy, and a disk too
small is an error at start-up."""

import filecmp
import glob
import importlib.util
import os
import pathlib

import pytest
import torch
from ds_zero.runtime.swap_tensor.aio import ALIGN, AsyncIOHandle, aligned_empty

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

BLOCK_SIZE, QUEUE_DEPTH, IO_PARALLEL = 16 * ALIGN, 2, 2
IO_SIZE = 3 * BLOCK_SIZE + 5 * ALIGN


def _handle():
    return AsyncIOHandle(BLOCK_SIZE, QUEUE_DEPTH, IO_PARALLEL)


def _ref_file(tmp_path, name, nbytes=IO_SIZE):
    data = os.urandom(nbytes)
    path = tmp_path / name
    path.write_bytes(data)
    return str(path), data


# --- upstream's aio cases ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("aligned", [True, False], ids=["locked", "unpinned"])
def test_parallel_and_async_read(tmp_path, aligned):
    h = _handle()
    assert (h.get_block_size(), h.get_queue_depth(), h.get_intra_op_parallelism()) == (
        BLOCK_SIZE,
        QUEUE_DEPTH,
        IO_PARALLEL,
    )
    path, data = _ref_file(tmp_path, "ref")
    buf = (
        h.new_cpu_locked_tensor(IO_SIZE, torch.empty(0, dtype=torch.uint8))
        if aligned
        else torch.empty(IO_SIZE, dtype=torch.uint8)
    )
    assert h.sync_pread(buf, path) == 1 and bytes(buf.tolist()) == data
    buf.zero_()
    assert h.async_pread(buf, path) == 0 and h.wait() == 1 and bytes(buf.tolist()) == data
    if aligned:
        assert h.direct_ok[path]  # aligned transfers went through O_DIRECT on this filesystem
    h.close()


@pytest.mark.parametrize("aligned", [True, False], ids=["locked", "unpinned"])
def test_parallel_and_async_write(tmp_path, aligned):
    h = _handle()
    ref, data = _ref_file(tmp_path, "ref")
    buf = (
        h.new_cpu_locked_tensor(IO_SIZE, torch.empty(0, dtype=torch.uint8))
        if aligned
        else torch.empty(IO_SIZE, dtype=torch.uint8)
    )
    buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    out = str(tmp_path / "sync")
    assert h.sync_pwrite(buf, out) == 1 and filecmp.cmp(ref, out, shallow=False)
    out = str(tmp_path / "async")
    assert h.async_pwrite(buf, out) == 0 and h.wait() == 1 and filecmp.cmp(ref, out, shallow=False)
    h.close()


@pytest.mark.parametrize("async_queue", [2, 3])
def test_async_queue_read_and_write(tmp_path, async_queue):
    h = _handle()
    refs = [_ref_file(tmp_path, f"ref{i}") for i in range(async_queue)]
    bufs = [aligned_empty(IO_SIZE, torch.uint8) for _ in range(async_queue)]
    for (path, _), buf in zip(refs, bufs):
        assert h.async_pread(buf, path) == 0
    assert h.wait() == async_queue
    assert all(bytes(b.tolist()) == d for b, (_, d) in zip(bufs, refs))
    outs = [str(tmp_path / f"out{i}") for i in range(async_queue)]
    for out, buf in zip(outs, bufs):
        assert h.async_pwrite(buf, out) == 0
    assert h.wait() == async_queue
    assert all(filecmp.cmp(p, o, shallow=False) for (p, _), o in zip(refs, outs))
    h.close()


@pytest.mark.parametrize("file_partitions", [[1, 1, 1], [1, 1, 2], [1, 2, 1], [2, 1, 1]])
def test_offset_write_and_read(tmp_path, file_partitions):
    h = _handle()
    unit = BLOCK_SIZE
    size = sum(file_partitions) * unit
    data = aligned_empty(size, torch.uint8)
    data.copy_(torch.frombuffer(bytearray(os.urandom(size)), dtype=torch.uint8))
    offsets = [sum(file_partitions[:i]) * unit for i in range(len(file_partitions))]
    ref, out = tmp_path / "ref", str(tmp_path / "aio")
    with open(ref, "wb") as f:
        for off, n in zip(offsets, file_partitions):
            chunk = data[off : off + n * unit]
            f.write(bytes(chunk.tolist()))
            f.flush()
            assert h.async_pwrite(chunk, out, off) == 0 and h.wait() == 1
            filecmp.clear_cache()
            assert filecmp.cmp(ref, out, shallow=False)
    dst = aligned_empty(size, torch.uint8)
    for off, n in zip(offsets, file_partitions):
        assert h.sync_pread(dst[: n * unit], out, off) == 1
        assert torch.equal(dst[: n * unit], data[off : off + n * unit])
    h.close()


# --- the engine -------------------------------------------------------------------------------------------------
STEPS, MICRO, SUB_GROUP = 4, 2, 512
MODEL = dict(hidden=32, depth=12)  # many small params: the states outweigh two swap buffers


def _config(world, root, optimizer: str, param: str):
    cfg = lib.base_config(3, world, micro=MICRO, gradient_clipping=0.5)
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
    z = cfg["zero_optimization"]
    z.update(stage3_param_persistence_threshold=0, sub_group_size=SUB_GROUP)
    if optimizer != "none":
        z["offload_optimizer"] = {
            "device": optimizer,
            "nvme_path": str(root),
            "buffer_count": 2,
            "pipeline_read": True,
            "pipeline_write": True,
        }
    if param != "none":
        z["offload_param"] = {"device": param, "nvme_path": str(root), "buffer_count": 6, "buffer_size": 2048}
    cfg["aio"] = {"block_size": 1 << 16, "queue_depth": 4, "intra_op_parallelism": 2}
    return cfg


CASES = [("nvme", "cpu"), ("nvme", "nvme"), ("cpu", "nvme")]


def _nvme_cases(rank, world, root):
    with lib.one_thread():
        return _nvme_cases_body(rank, world, root)


def _nvme_cases_body(rank, world, root):
    import ds_zero
    from ds_zero.config import DeepSpeedConfigError

    out = {}
    x, y = lib.make_data(STEPS, MICRO * world)
    base, *_ = ds_zero.initialize(model=lib.make_model(**MODEL), config=_config(world, root, "none", "none"))
    out["base"] = lib.train_ds(base, x, y, rank, world, MICRO, 1)
    base_sd = base.optimizer.state_dict()
    out["base_params"] = lib.full_params(base)
    base.destroy()
    for case in CASES:
        engine, *_ = ds_zero.initialize(model=lib.make_model(**MODEL), config=_config(world, root, *case))
        inf = engine.optimizer.nvme
        events = []
        if inf.optimizer_swapper is not None:
            real_read = inf.aio.read

            def read(t, path, offset=0, real_read=real_read, events=events):
                if os.path.basename(path).startswith("optimizer_"):
                    events.append(("read", os.path.basename(path)))
                return real_read(t, path, offset)

            inf.aio.read = read
        real_update = engine.optimizer.client_optimizer.update

        def update(*a, real_update=real_update, events=events, **k):
            events.append(("update",))
            return real_update(*a, **k)

        engine.optimizer.client_optimizer.update = update
        prefetched = []
        if inf.param_swapper is not None:
            real_swap_in = inf.param_swapper.swap_in

            def swap_in(params, async_op=False, real=real_swap_in, prefetched=prefetched):
                if async_op:
                    prefetched.append(len(params))
                return real(params, async_op)

            inf.param_swapper.swap_in = swap_in
        losses = lib.train_ds(engine, x, y, rank, world, MICRO, 1)
        res = {
            "losses": losses,
            "memory": engine.memory_breakdown(),
            "prefetched": sum(prefetched),
            "events": events[:12],
            "params": lib.full_params(engine),
        }
        folder = sorted(f for f in inf.folders)
        res["files"] = sorted(os.path.relpath(p, root) for f in folder for p in glob.glob(os.path.join(f, "*")))
        if inf.optimizer_swapper is not None:
            # Read the states straight from disk (no swapper): master, momentum, variance per sub-group.
            sw, disk = inf.optimizer_swapper, []
            for k, path in enumerate(sw.paths):
                raw = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.float32)
                n, seg = sw.sizes[k], sw.segment[k]
                disk.append((raw[:n].clone(), raw[seg : seg + n].clone(), raw[2 * seg : 2 * seg + n].clone()))
            res["disk"] = disk
            res["sub_groups"] = [(gi, lo, hi) for gi, lo, hi, _ in inf.sub_groups]
        # Checkpoint after the run, resume, continue: bitwise equal to continuing directly.
        save = os.path.join(root, f"ckpt_{case[0]}_{case[1]}")
        engine.save_checkpoint(save)
        more = lib.train_ds(engine, x[:2], y[:2], rank, world, MICRO, 1)
        engine.destroy()
        res["gone"] = not any(os.path.exists(f) for f in folder)
        again, *_ = ds_zero.initialize(model=lib.make_model(**MODEL), config=_config(world, root, *case))
        again.load_checkpoint(save)
        res["resume"] = (more, lib.train_ds(again, x[:2], y[:2], rank, world, MICRO, 1))
        again.destroy()
        out[case] = res
    out["base_state"] = (base_sd["master_partitions"], base_sd["optimizer_state_dict"]["state"])
    # A disk too small: refused in initialize, before the engine communicates.
    import shutil as sh

    real_usage = sh.disk_usage
    sh.disk_usage = lambda p: real_usage(p)._replace(free=1024)
    try:
        ds_zero.initialize(model=lib.make_model(**MODEL), config=_config(world, root, "nvme", "nvme"))
    except DeepSpeedConfigError as e:
        out["full_disk"] = str(e)
    finally:
        sh.disk_usage = real_usage
    return out


def test_nvme_offload_trains_like_the_engine_with_states_on_disk(tmp_path):
    world = 2
    results = run_ranks(_nvme_cases, world, str(tmp_path), timeout=300)
    for r in results:
        for case in CASES:
            res = r[case]
            assert res["losses"] == pytest.approx(r["base"], rel=1e-5), case
            for name, p in r["base_params"].items():
                torch.testing.assert_close(res["params"][name], p, rtol=1e-4, atol=1e-5, msg=f"{case} {name}")
            dev, host, nvme = res["memory"], res["memory"]["offload"]["cpu"], res["memory"]["offload"]["nvme"]
            assert dev["optimizer_states"] == 0 and dev["parameters"] == 0, case
            assert res["files"], case  # the swap files existed during training
            assert res["gone"], case  # and are removed with the engine
            assert res["resume"][0] == res["resume"][1], case
            numel = sum(p.numel() for p in lib.make_model(**MODEL).parameters())
            per_rank = numel / world
            if case[0] == "nvme":
                assert nvme["optimizer_states"] >= 12 * per_rank  # masters + moments on disk (aligned files)
                # in host memory only the two swap buffers (3 * sub_group_size fp32 each, aligned)
                assert host["optimizer_states"] <= 2 * 3 * (SUB_GROUP + 1024) * 4 < 12 * per_rank
                ev = res["events"]
                # pipeline_read: sub-group 1's read is issued before sub-group 0 is stepped
                assert ev.index(("read", "optimizer_subgroup_1.swp")) < ev.index(("update",)), ev
                # The files hold the optimizer's tensors: equal to the non-offloaded engine's after the same steps.
                base_masters, base_state = r["base_state"]
                states = list(base_state.values())
                for (gi, lo, hi), (master, exp_avg, exp_avg_sq) in zip(res["sub_groups"], res["disk"]):
                    torch.testing.assert_close(master, base_masters[gi][lo:hi], rtol=1e-4, atol=1e-6)
                    torch.testing.assert_close(exp_avg, states[gi]["exp_avg"][lo:hi], rtol=1e-4, atol=1e-7)
                    torch.testing.assert_close(exp_avg_sq, states[gi]["exp_avg_sq"][lo:hi], rtol=1e-4, atol=1e-9)
            if case[1] == "nvme":
                assert nvme["parameters"] >= 4 * per_rank and res["prefetched"] > 0, case
        assert "offload_optimizer.nvme_path" in r["full_disk"] and "MiB free" in r["full_disk"]
