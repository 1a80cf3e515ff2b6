"""Stores: c10d semantics (parity with torch's TCPStore), blocking and timeouts, concurrency, and hostile clients."""

from __future__ import annotations

import datetime
import gc
import os
import socket
import stat
import struct
import threading
import time

import pytest
import torch.distributed as dist
from pt_dist import DistError, DistNetworkError, DistStoreError, FileStore, HashStore, PrefixStore, TCPStore
from pt_dist._infra import wire
from pt_dist._infra.secret import SECRET_ENV
from pt_dist._infra.store import GET, SET, WAIT

from harness import run_ranks

SECRET = b"test-secret"


@pytest.fixture(params=["tcp", "file", "hash"])
def store(request, tmp_path):
    if request.param == "tcp":
        s = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2, secret=SECRET)
        yield s
        s.close()
    elif request.param == "file":
        yield FileStore(str(tmp_path / "store"), 1, timeout=2)
    else:
        yield HashStore(timeout=2)


def _script(s) -> list:
    """A sequence of store calls whose every result is recorded (run on ours and on torch's)."""
    out = [s.set("a", "1"), s.get("a"), s.add("n", 5), s.add("n", -2), s.get("n")]
    out += [s.compare_set("missing", "", "v1"), s.get("missing")]           # absent + empty expected: set
    out += [s.compare_set("absent2", "x", "v2"), s.check(["absent2"])]      # absent + non-empty: returns expected
    out += [s.compare_set("a", "1", "2"), s.get("a")]                       # equal: swap
    out += [s.compare_set("a", "1", "3"), s.get("a")]                       # unequal: current value back
    out += [s.set("b", b"\x00\xff"), s.get("b"), s.check(["a", "b"]), s.check(["a", "zz"])]
    out += [s.delete_key("b"), s.delete_key("b"), s.check(["b"])]
    out += [s.append("ap", "x"), s.append("ap", b"\x00yz"), s.get("ap")]     # append creates, then extends
    out += [s.multi_set(["m1", "m2"], ["1", b"2"]), s.multi_get(["m1", "m2", "a"])]
    out += [s.add("wrap", (1 << 63) - 1), s.add("wrap", 1), s.get("wrap")]  # int64 wraps (we dropped the client)
    return [x.encode() if isinstance(x, str) else x for x in out]


def test_add_on_a_key_without_an_integer_is_an_error_and_the_store_goes_on(store):
    """The server used to drop the connection ("connection reset"), as torch's own does."""
    store.set("word", "hello")
    with pytest.raises(ValueError, match="add\\('word'\\): the key holds b'hello', not an integer"):
        store.add("word", 1)
    assert store.get("word") == b"hello" and store.add("n", 2) == 2
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        store.multi_set(["x", "y"], ["1"])
    if isinstance(store, TCPStore):  # refused before sending (the server drops frames over its limit)
        with pytest.raises(ValueError, match="exceeds the store's 67108864-byte frame limit"):
            store.set("big", bytes(64 << 20))
        assert store.get("word") == b"hello"


def test_store_semantics_match_torch_tcpstore(store):
    ref = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=2))
    assert _script(store) == _script(ref)
    assert _script.__doc__  # the script really ran calls with results, so a wrong answer would differ:
    assert store.get("n") == b"3"


def test_blocking_get_released_by_a_later_set(store):
    setter = threading.Timer(0.3, lambda: store.set("late", "here"))
    setter.start()
    t0 = time.monotonic()
    assert store.get("late") == b"here"
    assert 0.2 < time.monotonic() - t0 < 2.0
    store.wait(["late"])
    setter.join()  # the set's reply may still be in flight when get returns: don't close the store under it


def test_get_and_wait_time_out(store):
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match="timed out"):
        store.get("never")
    assert 1.5 < time.monotonic() - t0 < 5
    with pytest.raises(DistStoreError, match="timed out"):
        store.wait(["never"], timeout=datetime.timedelta(seconds=0.2))


def test_concurrent_adds_and_a_single_compare_set_winner(store):
    if isinstance(store, TCPStore):  # generous timeouts: connecting 4 clients on a loaded machine can be slow
        clients = [TCPStore("127.0.0.1", store.port, timeout=30, secret=SECRET) for _ in range(4)]
    elif isinstance(store, FileStore):
        clients = [FileStore(store.path, timeout=30) for _ in range(4)]
    else:
        clients = [store] * 4  # one in-process store, four threads
    wins = []

    def worker(c, i):
        for _ in range(50):
            c.add("count", 1)
        if c.compare_set("leader", "", f"w{i}") == f"w{i}".encode():
            wins.append(i)

    threads = [threading.Thread(target=worker, args=(c, i)) for i, c in enumerate(clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert store.get("count") == str(50 * len(clients)).encode()
    assert len(wins) == 1 and store.get("leader") == f"w{wins[0]}".encode()


def test_prefix_store_namespaces(store):
    a, b = PrefixStore("g1", store), PrefixStore("g2", store)
    a.set("k", "1")
    b.set("k", "2")
    assert (a.get("k"), b.get("k"), store.get("g1/k")) == (b"1", b"2", b"1")


def _rank_adds(rank, world_size, port):
    s = TCPStore("127.0.0.1", port, timeout=30, secret=SECRET)
    for _ in range(100):
        s.add("ranks/count", 1)
    s.add("ranks/arrived", 1)
    if rank == 0:  # blocks until the last rank's set below
        return s.get("ranks/last").decode()
    if rank == world_size - 1:
        while int(s.get("ranks/arrived")) < world_size:
            time.sleep(0.01)
        s.set("ranks/last", f"set by {rank}")
    return None


def test_concurrent_adds_from_all_ranks():
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=30, secret=SECRET)
    out = run_ranks(_rank_adds, 4, master.port, backend=None, timeout=120)
    assert out[0] == "set by 3"
    assert master.get("ranks/count") == b"400"


def test_port_zero_reports_the_bound_port_and_binds_loopback():
    s = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2, secret=SECRET)
    assert s.port > 0 and s._server._sock.getsockname()[0] == "127.0.0.1"
    with pytest.raises(ValueError, match="port=0"):
        TCPStore("127.0.0.1", 0, is_master=False)


def test_master_waits_for_workers_with_a_timeout():
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match="1/3 clients joined"):
        TCPStore("127.0.0.1", 0, 3, is_master=True, timeout=0.5, secret=SECRET)
    assert time.monotonic() - t0 < 5


def test_wrong_secret_client_is_refused_and_the_store_keeps_serving():
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2, secret=SECRET)
    master.set("k", "v")
    before = master.num_keys()
    with pytest.raises(DistNetworkError, match="refused"):  # torch's kind for a connection that fails
        TCPStore("127.0.0.1", master.port, timeout=2, secret=b"not-the-secret")
    assert master.num_keys() == before and master.get("k") == b"v"
    os.environ[SECRET_ENV] = SECRET.decode()  # the env variable is the secret when none is passed
    try:
        assert TCPStore("127.0.0.1", master.port, timeout=2).get("k") == b"v"
    finally:
        del os.environ[SECRET_ENV]


def _raw(port) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=3)


def _closed(sock) -> bool:
    """Whether the server closes ``sock`` within its 3 s timeout (a reset counts; silence does not)."""
    try:
        while True:
            if sock.recv(4096) == b"":
                return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_garbage_bytes_close_only_that_connection():
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2, secret=SECRET)
    client = TCPStore("127.0.0.1", master.port, timeout=2, secret=SECRET)
    junk = _raw(master.port)
    junk.sendall(os.urandom(64) + b"\n\r\x00" * 100)  # no handshake at all
    assert _closed(junk)
    bad_frames = [struct.pack("<I", 1 << 31),                     # absurd length
                  struct.pack("<I", 3) + b"\x63ab",                # unknown command
                  struct.pack("<I", 9) + bytes([SET]) + struct.pack("<I", 500) + b"abcd"]  # field overruns
    for frame in bad_frames:  # authenticated but malformed
        sock = _raw(master.port)
        wire.client_handshake(sock, SECRET)
        sock.sendall(frame)
        assert _closed(sock)
    client.set("still", "alive")
    assert master.get("still") == b"alive" and client.add("c", 2) == 2


def test_a_timeout_of_timedelta_max_means_no_timeout(store):
    """Such timeouts overflowed the socket and lock waits (OverflowError, or a dropped connection)."""
    store.set_timeout(datetime.timedelta.max)
    setter = threading.Timer(0.2, lambda: store.set("late", "v"))
    setter.start()
    assert store.get("late") == b"v"
    store.wait(["late"], datetime.timedelta.max)
    setter.join()  # (its reply may still be in flight: the fixture must not close the store under it)


def test_a_wait_bound_that_is_nan_infinite_or_huge_neither_kills_nor_parks_a_server_thread():
    """``get``/``wait`` carry the client's timeout as a double: a NaN made the serving thread drop the connection
    (``Condition.wait`` raised ValueError), an infinite or huge one killed it mid-request (OverflowError)."""
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5, secret=SECRET)
    sock = _raw(master.port)
    wire.client_handshake(sock, SECRET)

    def request(cmd, *fields):
        wire.send_frame(sock, bytes([cmd]) + wire.pack_fields(*fields))
        return wire.recv_frame(sock, 1 << 20)

    for bad in (float("nan"), float("inf"), -1.0):
        reply = request(GET, b"never", struct.pack("<d", bad))
        assert reply[:1] == b"\x01" and b"timeout must be a finite number of seconds >= 0" in reply, reply
        reply = request(WAIT, wire.pack_fields(b"never"), struct.pack("<d", bad))
        assert b"wait: timeout must be a finite" in reply, reply
    setter = threading.Timer(0.3, lambda: master.set("late", "v"))
    setter.start()
    assert request(GET, b"late", struct.pack("<d", 1e300)) == b"\x00\x01v"  # capped as timedelta.max: it waits
    assert request(WAIT, wire.pack_fields(b"late"), struct.pack("<d", 1e300)) == b"\x00\x01"
    setter.join()
    sock.close()
    master.close()


def test_file_store_refuses_a_symlink_and_a_file_another_user_owns_or_may_read(tmp_path, monkeypatch):
    """The log carries the backends' secret: it was opened through symlinks and whoever's file it was."""
    target, link = tmp_path / "target", tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(DistError, match="link is a symlink; refusing to follow it"):
        FileStore(str(link), 1, timeout=1)
    assert not target.exists()  # not created through the link either
    loose = tmp_path / "loose"
    loose.write_bytes(b"")
    loose.chmod(0o644)
    with pytest.raises(DistError, match="loose has mode 644: other users may read or change it"):
        FileStore(str(loose), 1, timeout=1)
    old = os.umask(0)
    try:
        fresh = FileStore(str(tmp_path / "fresh"), 1, timeout=1)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o600
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # the same file, seen by another user
    with pytest.raises(DistError, match="belongs to uid 0, not to this user .uid 4242."):
        FileStore(str(tmp_path / "fresh"), 1, timeout=1)
    monkeypatch.undo()
    fresh.close()


def test_closing_the_master_ends_the_server_threads_blocked_in_get():
    """They waited for their key until their client's timeout (300 s by default), each keeping the closed
    server's data alive, across every init/destroy cycle."""
    before = set(threading.enumerate())
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=60, secret=SECRET)
    client = TCPStore("127.0.0.1", master.port, timeout=60, secret=SECRET)
    for _ in range(3):
        threading.Thread(target=lambda: pytest.raises(DistNetworkError, client.get, "never"), daemon=True).start()
    time.sleep(0.5)
    serving = [t for t in threading.enumerate() if t not in before and t.name == "pt_dist-store-conn"]
    assert len(serving) >= 3
    master.close()
    client.close()
    for t in serving:
        t.join(3)
    assert not any(t.is_alive() for t in serving)


def test_a_client_trusts_only_a_server_that_proves_the_secret():
    """The handshake was one-way: an impostor on the store's address (another user who took the port first)
    could greet with any nonce, say OK and then feed the ranks any value, the mesh secret included."""
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor():
        conn, _ = listener.accept()
        conn.sendall(wire.MAGIC + os.urandom(wire.NONCE_BYTES))
        wire.recv_exact(conn, wire.DIGEST_BYTES + wire.NONCE_BYTES)  # it cannot check the client's proof either
        conn.sendall(b"OK" + os.urandom(wire.DIGEST_BYTES))
        time.sleep(2)
        conn.close()

    threading.Thread(target=impostor, daemon=True).start()
    with pytest.raises(DistNetworkError, match="did not prove the shared secret"):
        TCPStore("127.0.0.1", listener.getsockname()[1], timeout=3, secret=SECRET)
    listener.close()


def test_a_handshake_dripping_a_byte_at_a_time_is_cut_at_the_handshake_timeout(monkeypatch):
    """A socket timeout bounds each read, not the handshake: a stranger sending one byte of its answer just
    within it held a handshake place for 48 timeouts."""
    monkeypatch.setattr(wire, "HANDSHAKE_TIMEOUT", 1.0)
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5, secret=SECRET)
    drip = _raw(master.port)
    wire.recv_exact(drip, len(wire.MAGIC) + wire.NONCE_BYTES)
    t0 = time.monotonic()
    with pytest.raises(OSError):
        for _ in range(wire.DIGEST_BYTES + wire.NONCE_BYTES):
            time.sleep(0.3)
            drip.sendall(b"x")
        drip.recv(1) or drip.sendall(b"x")  # (closed: the read says so, or the write after it fails)
    assert time.monotonic() - t0 < 4
    drip.close()


def test_a_flood_of_silent_connections_neither_keeps_clients_out_nor_piles_up_threads(monkeypatch):
    """Connections that never send the handshake each hold a server thread for up to its timeout. Past
    ``MAX_UNAUTHENTICATED`` of them waiting, the oldest is cut for each newcomer, so a client with the secret
    gets in at once however many strangers hold connections open (it used to be shut out until their
    timeouts ran out, for as long as they kept reconnecting), and handshake threads stay bounded."""
    from pt_dist._infra import store_server

    monkeypatch.setattr(store_server, "MAX_UNAUTHENTICATED", 4)
    before = set(threading.enumerate())  # (other tests' servers may still be winding down)
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5, secret=SECRET)
    silent = [_raw(master.port) for _ in range(4)]
    time.sleep(0.3)  # the server has taken them into their handshakes
    extra = [_raw(master.port) for _ in range(3)]
    assert all(_closed(sock) for sock in silent[:3])  # the three oldest made room for the three newest
    silent[3].settimeout(0.3)
    assert not _closed(silent[3])
    flood = [_raw(master.port) for _ in range(60)]
    for _ in range(40):  # threads of cut connections end within moments
        handshaking = [t for t in threading.enumerate() if t.name == "pt_dist-store-conn" and t not in before]
        if len(handshaking) <= 2 * 4 + 1:  # (+1: the master's own client, served)
            break
        time.sleep(0.05)
    assert len(handshaking) <= 2 * 4 + 1, len(handshaking)
    t0 = time.monotonic()
    client = TCPStore("127.0.0.1", master.port, timeout=5, secret=SECRET)  # the strangers still hold on
    assert time.monotonic() - t0 < 4  # (it used to wait out the strangers' 10 s handshake timeout)
    client.set("k", "v")
    assert master.get("k") == b"v"
    for sock in silent + extra + flood:
        sock.close()


def test_file_store_is_shared_through_the_file(tmp_path):
    a, b = FileStore(str(tmp_path / "f"), timeout=2), FileStore(str(tmp_path / "f"), timeout=2)
    a.set("x", "1")
    assert b.get("x") == b"1" and b.add("x", 4) == 5 and a.get("x") == b"5"
    assert a.num_keys() == b.num_keys() == 2  # "x", and the users count c10d's FileStore counts too


def test_file_store_is_removed_by_its_last_user_and_starts_empty_again(tmp_path):
    """c10d's FileStore contract: the last of world_size users to close removes the file, so a rerun of the same
    job (same path) does not read the previous run's keys."""
    path = str(tmp_path / "rdzv")
    a, b = FileStore(path, 2, timeout=0.5), FileStore(path, 2, timeout=0.5)
    assert (a.opened_as, b.opened_as) == (1, 2)
    a.set("addr", "old")
    a.close()
    assert os.path.exists(path) and b.get("addr") == b"old"  # b still uses it
    b.close()
    assert not os.path.exists(path)
    c = FileStore(path, 2, timeout=0.5)
    assert c.opened_as == 1 and c.num_keys() == 1  # (the users count only)
    with pytest.raises(DistStoreError, match="timed out"):
        c.get("addr")
    d = FileStore(path, 2, timeout=0.5)
    c.set("addr", "new")
    del c, d  # dropped without close(), as c10d's destructor signs off too (the file was left, keys and all)
    gc.collect()
    assert not os.path.exists(path)


def test_a_store_nobody_serves_is_a_network_error_within_the_timeout():
    """torch's kinds: failing to connect is a DistNetworkError, a key that never comes a DistStoreError."""
    port = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2, secret=SECRET)
    gone = port.port
    port.close()
    t0 = time.monotonic()
    with pytest.raises(DistNetworkError, match=f"could not connect to 127.0.0.1:{gone} within 0.5s"):
        TCPStore("127.0.0.1", gone, timeout=0.5, secret=SECRET)
    assert time.monotonic() - t0 < 3


def test_a_port_already_taken_is_a_clear_store_error():
    first = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2, secret=SECRET)
    with pytest.raises(DistNetworkError, match=f"cannot listen on 127.0.0.1:{first.port}.*another job"):
        TCPStore("127.0.0.1", first.port, 1, is_master=True, timeout=2, secret=SECRET)
    first.close()


def test_multi_tenant_masters_on_one_port_share_the_server_until_the_last_closes():
    """torch's multi_tenant TCPStore (what rendezvous makes: init_process_group and rpc.init_rpc on one
    MASTER_PORT): a second master in the process shares the first's server and keys; the server stops with the
    last of them; without multi_tenant the port is refused as above."""
    first = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=2, multi_tenant=True, secret=SECRET)
    second = TCPStore("127.0.0.1", first.port, 1, is_master=True, timeout=2, multi_tenant=True, secret=SECRET)
    client = TCPStore("127.0.0.1", first.port, 1, timeout=2, secret=SECRET)
    first.set("k", "v")
    assert second.get("k") == b"v" and second.is_master
    with pytest.raises(DistNetworkError, match="cannot listen"):
        TCPStore("127.0.0.1", first.port, 1, is_master=True, timeout=2, secret=SECRET)
    first.close()
    client.set("k2", "v2")  # still served
    assert second.get("k2") == b"v2"
    second.close()
    with pytest.raises(DistNetworkError):
        TCPStore("127.0.0.1", first.port, 1, timeout=1, secret=SECRET)
    third = TCPStore("127.0.0.1", first.port, 1, is_master=True, timeout=2, multi_tenant=True, secret=SECRET)
    assert not third.check(["k"])  # a new server: the port was freed
    third.close()
    client.close()


def test_a_forked_child_collecting_its_copy_leaves_the_parents_store_serving():
    """DataLoader workers and ``os.fork()`` children inherit the master's server sockets. A child that exits through
    ``sys.exit`` collects its copy of the store; shutting the shared sockets down there cut the parent's own
    clients (every rank's next store call failed with "connection reset": new_group, destroy)."""
    master = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=5)
    client = TCPStore("127.0.0.1", master.port, 2, timeout=5)
    client.set("before", "1")
    pid = os.fork()
    if pid == 0:
        try:
            client.close()
            master.close()  # what garbage-collecting them in the child does (TCPStore.__del__)
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    client.set("after", "2")
    assert master.get("before") == b"1" and client.get("after") == b"2"
    client.close()
    master.close()


def test_ctrl_c_inside_a_file_store_call_leaves_the_file_unlocked(tmp_path, monkeypatch):
    """A KeyboardInterrupt landing just after the store took the file's flock (Ctrl-C while init waits for a peer,
    under load) must not leave that lock held by a file object only the traceback still references: init's
    cleanup, running while that traceback is alive, closes the store and would wait on the lock forever."""
    import fcntl
    import threading

    from pt_dist._infra import file_store

    store = FileStore(str(tmp_path / "f"), 1, timeout=5)
    pressed = []

    class InterruptedAfterLocking:
        LOCK_EX, LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_UN

        @staticmethod
        def flock(f, how):
            fcntl.flock(f, how)
            if how == fcntl.LOCK_EX and not pressed:
                pressed.append(1)
                raise KeyboardInterrupt

    monkeypatch.setattr(file_store, "fcntl", InterruptedAfterLocking)
    try:
        store.set("k", "v")
    except KeyboardInterrupt:  # as init_process_group's cleanup: the store is closed while the exception is alive
        closer = threading.Thread(target=store.close, daemon=True)
        closer.start()
        closer.join(5)
        assert not closer.is_alive(), "closing the store waits forever on the flock the interrupted call kept"
    assert pressed
