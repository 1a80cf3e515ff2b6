"""The harness's own guarantees: results by rank, raising/hanging/killed ranks fail fast and by name."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from harness import RankError, run_ranks, store


def _all_reduce(rank, world_size):
    t = torch.arange(5, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    return t


def test_four_ranks_all_reduce():
    out = run_ranks(_all_reduce, 4, backend="gloo")
    expected = torch.arange(5, dtype=torch.float32) * sum(range(1, 5))
    assert len(out) == 4
    for t in out:
        torch.testing.assert_close(t, expected, rtol=0, atol=0)


def _identity(rank, world_size, payload):
    return rank, world_size, dist.get_rank(), dist.get_world_size(), payload, os.environ["RANK"]


def test_args_and_results_by_rank():
    out = run_ranks(_identity, 3, {"x": [1, 2]}, backend="gloo")
    assert out == [(r, 3, r, 3, {"x": [1, 2]}, str(r)) for r in range(3)]


def _noop(rank, world_size):
    return rank


def _warm_pool(world_size):
    """Spawn the pooled ranks before a timed check: starting them (importing torch) is not the job's time."""
    assert run_ranks(_noop, world_size, backend=None) == list(range(world_size))


def _raise_on_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom from the test")
    dist.barrier()  # rank 0 is stuck here until it is killed


def test_raising_rank_is_named_with_traceback():
    _warm_pool(2)
    t0 = time.monotonic()
    with pytest.raises(RankError) as err:
        run_ranks(_raise_on_one, 2, backend="gloo", timeout=60)
    msg = str(err.value)
    assert "rank 1 raised" in msg and "ValueError: boom from the test" in msg and "_raise_on_one" in msg
    assert time.monotonic() - t0 < 30, "a raising rank must not wait for the full timeout"


def _hang_on_one(rank, world_size):
    if rank == 1:
        time.sleep(3600)
    return rank


@pytest.mark.parametrize("tmpdir_env", [False, True])
def test_hanging_rank_times_out_and_is_named(tmpdir_env, tmp_path):
    """With ``TMPDIR`` set for the ranks, the stacks once went to a file the parent never read (or removed)."""
    env = {"TMPDIR": str(tmp_path)} if tmpdir_env else None
    if not env:
        _warm_pool(2)
    t0 = time.monotonic()
    with pytest.raises(RankError) as err:
        run_ranks(_hang_on_one, 2, backend="gloo", timeout=3 if not env else 6, env=env)
    assert "ranks [1] did not finish (timed out" in str(err.value)
    # and where it hung: its threads' stacks, taken before it was killed
    assert "rank 1's threads when it was given up on" in str(err.value) and "in _hang_on_one" in str(err.value)
    assert time.monotonic() - t0 < 40
    assert list(tmp_path.iterdir()) == []


def _change_process_state(rank, world_size, cwd):
    os.environ["HARNESS_LEFT_BEHIND"] = "yes"
    os.chdir(cwd)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.manual_seed(1234)


def _process_state(rank, world_size):
    return (os.environ.get("HARNESS_LEFT_BEHIND"), os.environ.get("HARNESS_PARENT_VAR"), os.getcwd(),
            torch.get_default_dtype(), torch.is_grad_enabled(), torch.rand(1).item())


def test_pooled_ranks_start_each_call_fresh(tmp_path, monkeypatch):
    """What one test's ranks changed process-wide leaked into the next test on the pool, and the parent's own
    environment reached the ranks only as it was when the pool was spawned."""
    fresh = run_ranks(_process_state, 2, backend=None)
    pids = run_ranks(_pid, 2, backend=None)
    run_ranks(_change_process_state, 2, str(tmp_path), backend=None)
    monkeypatch.setenv("HARNESS_PARENT_VAR", "now")
    after = run_ranks(_process_state, 2, backend=None)
    assert run_ranks(_pid, 2, backend=None) == pids  # the same pooled processes
    assert [a[0] for a in after] == [None, None] and [a[1] for a in after] == ["now", "now"]
    assert [a[2:] for a in after] == [f[2:] for f in fresh]


def _pid(rank, world_size):
    return os.getpid()


def _fork_child(rank, world_size):
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(7,))
    child.start()  # refused in a daemonic process ("daemonic processes are not allowed to have children")
    child.join(30)
    return child.exitcode


def test_ranks_may_start_processes_of_their_own():
    assert run_ranks(_fork_child, 2, backend=None) == [7, 7]


def test_pooled_ranks_exit_when_the_parent_is_killed(tmp_path):
    """Without the session's teardown (pytest killed by a CI timeout or the OOM killer) ranks waited forever."""
    script = textwrap.dedent(f'''
        import os, signal, sys
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        from harness import run_ranks
        from test_run_ranks import _pid
        if __name__ == "__main__":
            print(*run_ranks(_pid, 2, backend=None, timeout=60), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    ''')
    (tmp_path / "parent.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr[-2000:]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.2)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert alive == []


def _die_on_one(rank, world_size):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_killed_rank_is_seen_before_the_timeout():
    _warm_pool(2)
    t0 = time.monotonic()
    with pytest.raises(RankError) as err:
        run_ranks(_die_on_one, 2, backend="gloo", timeout=120)
    assert "rank 1 died (killed by SIGKILL)" in str(err.value)
    assert time.monotonic() - t0 < 30


def _sees_env(rank, world_size):
    return os.environ.get("HARNESS_TEST_VAR")


def test_env_reaches_fresh_ranks():
    assert run_ranks(_sees_env, 2, backend=None, env={"HARNESS_TEST_VAR": "on"}) == ["on", "on"]


def _publish(rank, world_size):
    s = store()
    s.set(f"k{rank}", str(rank * 10))
    return [int(s.get(f"k{r}")) for r in range(world_size)]


def test_store_without_process_group():
    assert not dist.is_initialized()
    assert run_ranks(_publish, 2, backend=None) == [[0, 10], [0, 10]]


def test_pool_survives_a_failure():
    with pytest.raises(RankError):
        run_ranks(_raise_on_one, 2, backend="gloo", timeout=60)
    out = run_ranks(_all_reduce, 2, backend="gloo")
    torch.testing.assert_close(out[0], torch.arange(5, dtype=torch.float32) * 3)


def test_lambda_is_refused():
    with pytest.raises(TypeError, match="module-level function"):
        run_ranks(lambda r, w: r, 1)


@pytest.mark.gpu(2)
def test_nccl_all_reduce_on_two_gpus():
    out = run_ranks(_all_reduce_cuda, 2, backend="auto")
    torch.testing.assert_close(out[0], torch.arange(5, dtype=torch.float32) * 3)


def _all_reduce_cuda(rank, world_size):
    assert dist.get_backend() == "nccl"
    t = torch.arange(5, dtype=torch.float32, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    return t.cpu()


def test_two_multi_rank_tests_in_parallel_under_xdist(tmp_path):
    """Two tests rendezvous at the same time in two xdist workers: no port clash, both pass."""
    (tmp_path / "test_par.py").write_text(textwrap.dedent("""
        import time, torch, torch.distributed as dist
        from harness import run_ranks

        def _work(rank, world_size):
            t = torch.ones(3)
            for _ in range(20):
                dist.all_reduce(t)
                t /= world_size
            return t

        def test_a():
            assert all(torch.allclose(t, torch.ones(3)) for t in run_ranks(_work, 2, backend="gloo"))

        def test_b():
            assert all(torch.allclose(t, torch.ones(3)) for t in run_ranks(_work, 2, backend="gloo"))
    """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider",
                           "--import-mode=importlib", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_a_gloo_connect_flake_on_one_rank_is_retried_by_all_ranks_together():
    """Rank 0's first connect fails as gloo's flaky connectFullMesh does, while ranks 1 and 2 connect: all three
    agree through the store, the connected ones tear down, and everyone connects again under a new prefix."""
    import threading

    from harness.worker import init_gloo_together

    master = dist.TCPStore("127.0.0.1", 0, 4, is_master=True, wait_for_workers=False)
    seen, out = {r: [] for r in range(3)}, {}

    def rank(r, flaky):
        st = dist.TCPStore("127.0.0.1", master.port, 4, is_master=False)

        def connect(prefix):
            seen[r].append(prefix)
            if (r, len(seen[r])) in flaky:
                raise RuntimeError(flaky[(r, len(seen[r]))])

        try:
            out[r] = init_gloo_together(st, r, 3, connect, lambda: seen[r].append("destroy"))
        except RuntimeError as e:
            out[r] = str(e)

    def run(flaky):
        threads = [threading.Thread(target=rank, args=(r, flaky)) for r in range(3)]
        [t.start() for t in threads]
        [t.join(30) for t in threads]

    run({(0, 1): "Gloo connectFullMesh failed with [pair.cc:561] Connection closed by peer"})
    assert out == {0: 2, 1: 2, 2: 2}
    assert seen == {0: ["pg", "pg1"], 1: ["pg", "destroy", "pg1"], 2: ["pg", "destroy", "pg1"]}
    # any other error propagates at once, before the rank even reports to the store
    seen[0], out[0] = [], None
    rank(0, {(0, 1): "some other RuntimeError"})
    assert out[0] == "some other RuntimeError" and seen[0] == ["pg"]


@pytest.mark.parametrize(("omp", "want"), [(None, 1), ("2", 2)])
def test_test_processes_get_one_intra_op_thread_unless_omp_num_threads_says(tmp_path, omp, want):
    """The plugin's default, as torchrun's for ranks: the xdist workers' torch (imported by the test module) and
    their subprocesses run one OpenMP thread; a user's OMP_NUM_THREADS is kept."""
    (tmp_path / "test_thr.py").write_text(textwrap.dedent(f"""
        import os, subprocess, sys, torch

        def test_threads():
            child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                   capture_output=True, text=True, check=True).stdout.strip()
            assert (torch.get_num_threads(), int(child), os.environ["OMP_NUM_THREADS"]) == ({want}, {want}, "{want}")
    """))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-q", "-p", "no:cacheprovider",
                           "--import-mode=importlib", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
