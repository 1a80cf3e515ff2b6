"""The job's shared secret (``secret.py``): no one can compute it, it is shared only through a file no other user can
read, and a multi-host job without one refuses, saying how to set one. The attacks here worked while the secret
was derived from the store's address (``pt_dist-rendezvous:host:port``)."""

from __future__ import annotations

import logging
import os
import stat
import sys
import time
from pathlib import Path

import pt_dist
import pytest
from pt_dist import DistError, DistNetworkError, TCPStore
from pt_dist._infra import secret

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """This test's secrets in a directory of its own; no secret or launcher counts in the environment."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    for name in (secret.SECRET_ENV, secret.INSECURE_ENV, "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "run" / "pt_dist"


class _Payload:
    """What an intruder sends through ``all_gather_object``: unpickling it runs code of the sender's choosing."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _job_with_an_intruder(rank, world_size, port, marker):
    """Rank 0 waits for rank 1 on tcp://; rank 1 first plays the intruder, who knows only host and port."""
    url = f"tcp://127.0.0.1:{port}"
    if rank == 0:
        pt_dist.init_process_group("tcp", init_method=url, rank=0, world_size=2, timeout=20)
        gathered = [None, None]
        pt_dist.all_gather_object(gathered, {"rank": 0})
        pt_dist.barrier()
        pt_dist.destroy_process_group()
        return gathered
    computed = f"pt_dist-rendezvous:127.0.0.1:{port}"
    time.sleep(0.5)  # rank 0's store is up
    try:
        pt_dist.init_process_group("tcp", init_method=f"{url}?secret={computed}", rank=1, world_size=2, timeout=20)
        intruded = True
    except DistNetworkError as e:
        intruded = f"refused: {e}"
    if intruded is True:  # in: the mesh secret came from the store, rank 0 now unpickles whatever it sends
        pt_dist.all_gather_object([None, None], _Payload(marker))
    else:  # the real rank 1: it reads the secret rank 0's store published for this user on this host
        pt_dist.init_process_group("tcp", init_method=url, rank=1, world_size=2, timeout=20)
        pt_dist.all_gather_object([None, None], {"rank": 1})
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    return intruded


def test_a_process_knowing_only_host_and_port_can_neither_join_nor_make_a_rank_unpickle(tmp_path):
    marker = tmp_path / "payload-ran"
    gathered, intruded = run_ranks(_job_with_an_intruder, 2, util.free_port(), str(marker), backend=None, timeout=90)
    assert not marker.exists(), "rank 0 unpickled the intruder's payload"
    assert intruded.startswith("refused: ") and "refused our shared secret" in intruded, intruded
    assert gathered == [{"rank": 0}, {"rank": 1}]


def test_the_secret_file_is_private_and_a_tampered_one_is_refused(runtime, monkeypatch):
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5)
    path = runtime / f"tcpstore-{master.port}.secret"
    assert stat.S_IMODE(runtime.lstat().st_mode) == 0o700 and stat.S_IMODE(path.lstat().st_mode) == 0o600
    assert path.read_bytes().split(b" ")[1] == master._secret and len(master._secret) == 32  # 16 random bytes
    other = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5)
    assert other._secret != master._secret  # drawn per store, not computed
    assert TCPStore("127.0.0.1", master.port, timeout=5).add("n", 1) == 1  # a client on this host reads it
    other.close()
    assert not (runtime / f"tcpstore-{other.port}.secret").exists()  # a master takes its file away

    path.chmod(0o644)  # readable by others: someone may have read it
    with pytest.raises(DistError, match="has mode 644: other users may read"):
        secret.read(master.port)
    path.chmod(0o600)
    real = path.read_bytes()
    path.unlink()
    (runtime / "planted").write_bytes(b"attacker's")
    (runtime / "planted").chmod(0o600)
    path.symlink_to(runtime / "planted")
    with pytest.raises(DistError, match="is a symlink"):
        secret.read(master.port)
    path.unlink()
    path.write_bytes(real)
    path.chmod(0o600)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # as seen by another user: not theirs, so not trusted
    with pytest.raises(DistError, match="belongs to uid 0, not to this user .uid 4242."):
        secret.read(master.port)
    monkeypatch.undo()
    master.close()


def test_a_runtime_directory_others_could_write_into_is_refused(runtime, tmp_path, monkeypatch):
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o777)
    with pytest.raises(DistError, match="has mode 777"):
        TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2)
    runtime.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    runtime.symlink_to(elsewhere)
    with pytest.raises(DistError, match="is a symlink"):
        TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2)


def test_a_multi_host_job_without_a_secret_refuses_saying_how_to_set_one(runtime, monkeypatch, caplog):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun --nnodes 2 --nproc-per-node 2
    port = util.free_port()
    how = r"export PT_DIST_SECRET=\$\(python -c \"import secrets; print\(secrets.token_hex\(16\)\)\"\)"
    for rank in (0, 1):
        t0 = time.monotonic()
        with pytest.raises(DistError, match=f"torchrun started 2 of its 4 ranks on this host.*{how}"):
            pt_dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
        assert time.monotonic() - t0 < 2  # at once, on every rank: no one waits for the others
    assert not pt_dist.is_initialized() and not runtime.exists()  # nothing bound, nothing published
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(DistError, match="the store at 192.0.2.1 is not on this host"):  # (TEST-NET-1)
        TCPStore("192.0.2.1", 29500, timeout=30)

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv(secret.SECRET_ENV, "shared-by-the-launcher")
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5)
    assert TCPStore("127.0.0.1", master.port, timeout=5, secret="shared-by-the-launcher").add("n", 1) == 1
    master.close()
    monkeypatch.delenv(secret.SECRET_ENV)
    monkeypatch.setenv(secret.INSECURE_ENV, "1")  # the explicit opt-in: it runs, and says what it costs
    with caplog.at_level(logging.WARNING, logger="pt_dist._infra.secret"):
        master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5)
        assert TCPStore("127.0.0.1", master.port, timeout=5).add("n", 1) == 1
    assert "any process that can reach it can compute" in caplog.text
    master.close()


def test_a_dead_masters_file_is_swept_by_the_next_master(runtime):
    """A rank killed while its store was up (the harness kills pooled ranks with SIGKILL) left its file behind,
    one per run, for good."""
    import subprocess

    runtime.mkdir(mode=0o700)
    ns = os.stat("/proc/self/ns/pid").st_ino
    gone = subprocess.Popen(["true"])
    gone.wait()
    for port, pid in ((1, gone.pid), (2, os.getpid())):
        f = runtime / f"tcpstore-{port}.secret"
        f.write_bytes(f"{pid}:{ns} {'ab' * 16}".encode())
        f.chmod(0o600)
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5)
    assert not (runtime / "tcpstore-1.secret").exists()  # its publisher is gone
    assert (runtime / "tcpstore-2.secret").exists()  # a live one's stays
    master.close()
