"""The job's shared secret: given (``?secret=``, ``$PT_DIST_SECRET``), else random and kept in a file only we can read.

Every pt_dist socket proves this secret (``wire.py``); torch's TCPStore has none. When the launcher gives none, the
store's master draws a random one and writes it to ``tcpstore-<port>.secret`` in a private runtime directory
(``$XDG_RUNTIME_DIR/pt_dist``, else ``/tmp/pt_dist-<uid>``: 0700, ours), as a 0600 file reached without
following symlinks; ranks on the same host read it there, and refuse anything another user owns or could read
(the scheme of Jupyter's connection files and multiprocessing's authkey). A job spanning hosts cannot share a
file that way, so it refuses unless ``PT_DIST_SECRET`` is set on every node, or ``PT_DIST_INSECURE=1`` opts
into a secret derived from the store's address, which anyone who can reach the store can compute.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat

from pt_dist._infra.errors import DistError

log = logging.getLogger(__name__)

SECRET_ENV = "PT_DIST_SECRET"
INSECURE_ENV = "PT_DIST_INSECURE"
HOW_TO_SET = (f'export {SECRET_ENV}=$(python -c "import secrets; print(secrets.token_hex(16))") with the same '
              f"value on every node before torchrun (or pass ?secret= in the init_method)")


def given(secret: str | bytes | None) -> bytes | None:
    """The secret the caller or the launcher chose: explicit, else ``$PT_DIST_SECRET``; None if neither."""
    if secret is None:
        secret = os.environ.get(SECRET_ENV) or None
    if secret is None:
        return None
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def insecure() -> bool:
    """Whether the user opted into an address-derived secret (``PT_DIST_INSECURE=1``)."""
    return os.environ.get(INSECURE_ENV, "") in ("1", "true", "True")


def derived(host: str, port: int) -> bytes:
    """The insecure opt-in's secret, logged as the warning it is."""
    log.warning("pt_dist: %s=1 and no %s: the store at %s:%s uses a secret derived from its address, which any "
                "process that can reach it can compute and then join the job and make ranks unpickle what it sends "
                "(all_gather_object); %s", INSECURE_ENV, SECRET_ENV, host, port, HOW_TO_SET)
    return f"pt_dist-rendezvous:{host}:{port}".encode()


def multi_host(host: str) -> str:
    """Why this job spans hosts ("" if it looks single-host): torchrun's counts, or a store on another host."""
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if world and local and world != local:
        return f"torchrun started {local} of its {world} ranks on this host"
    if not _is_local(host):
        return f"the store at {host} is not on this host"
    return ""


def _is_local(host: str) -> bool:
    """Whether ``host`` names this machine: an address of it can be bound (loopback, an interface's address)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def refuse_multi_host(host: str, port: int) -> None:
    """No secret given and no file to share one through: say how to set one, before any connection is made."""
    why = "" if insecure() else multi_host(host)
    if why:
        raise DistError(f"pt_dist: no shared secret for the store at {host}:{port}, and {why}, so a secret cannot "
                        f"be handed out through a private file: {HOW_TO_SET}. ({INSECURE_ENV}=1 would use one "
                        f"anyone who can reach the store can compute)")


def runtime_dir() -> str:
    """Our private directory for secrets (made 0700 if absent); refused unless it is a real directory of ours that
    no one else can enter."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.join(base, "pt_dist") if base else f"/tmp/pt_dist-{os.geteuid()}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private(os.lstat(path), path, stat.S_ISDIR, "directory")
    return path


def check_private(st: os.stat_result, path: str, is_kind, kind: str) -> None:
    """Refuse ``path`` (its ``lstat``/``fstat``) unless it is a ``kind`` that we own and no one else may use."""
    if stat.S_ISLNK(st.st_mode):
        raise DistError(f"pt_dist: {path} is a symlink; refusing to follow it")
    if not is_kind(st.st_mode):
        raise DistError(f"pt_dist: {path} is not a {kind}")
    if st.st_uid != os.geteuid():
        raise DistError(f"pt_dist: {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); "
                        f"refusing what another user could have planted or could read")
    if st.st_mode & 0o077:
        raise DistError(f"pt_dist: {path} has mode {stat.S_IMODE(st.st_mode):o}: other users may read or change it "
                        f"(want {'700' if kind == 'directory' else '600'})")


def _path(port: int) -> str:
    return os.path.join(runtime_dir(), f"tcpstore-{port}.secret")


def _owner() -> bytes:
    """Who publishes: pid and pid namespace, so a later master can tell a dead one's file (``sweep``)."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{os.getpid()}:{ns}".encode()


def publish(port: int) -> tuple[bytes, str]:
    """A fresh random secret for the store on ``port``, written for this user's ranks: (secret, file). The file
    holds ``<pid>:<pid namespace> <secret>``."""
    sweep()
    secret = secrets.token_hex(16).encode()
    path = _path(port)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, _owner() + b" " + secret)
    finally:
        os.close(fd)
    os.replace(tmp, path)  # whole or absent: a reader never sees half a secret (a dead master's file is replaced)
    return secret, path


def _contents(path: str) -> tuple[bytes, bytes] | None:
    """(owner, secret) of a published file, checked private; None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: the name is a symlink
        check_private(os.lstat(path), path, stat.S_ISREG, "regular file")
        raise DistError(f"pt_dist: cannot open {path}: {e}") from e
    try:
        check_private(os.fstat(fd), path, stat.S_ISREG, "regular file")
        owner, _, secret = os.read(fd, 256).partition(b" ")
        return (owner, secret) if secret else None
    finally:
        os.close(fd)


def read(port: int) -> bytes | None:
    """The secret the master of ``port`` on this host published (None: not yet, or not for this user)."""
    found = _contents(_path(port))
    return None if found is None else found[1]


def sweep() -> list[str]:
    """Remove the files of masters that died without closing (a rank killed with its store): judged by pid, and
    only for publishers in this pid namespace, whose pids mean something here."""
    removed, here = [], _owner().split(b":")[1]
    directory = runtime_dir()
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            found = _contents(path) if name.startswith("tcpstore-") and name.endswith(".secret") else None
        except DistError:
            continue  # not ours to judge (refused anyway when read)
        pid, _, ns = (found[0] if found else b"").partition(b":")
        if not found or ns != here or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            unpublish(path, found[1])
            removed.append(path)
        except OSError:
            pass
    return removed


def unpublish(path: str, secret: bytes) -> None:
    """Remove the master's file, unless a newer master on the same port has replaced it."""
    try:
        found = _contents(path)
        if found is not None and found[1] == secret:
            os.unlink(path)
    except (OSError, DistError):
        pass


def mesh_secret(store, rank: int) -> bytes:
    """A fresh random secret for the backends' sockets (the mesh), rank 0's, handed out through the store."""
    if rank == 0:
        token = secrets.token_hex(16)
        store.set("pt_dist/mesh_secret", token)
        return token.encode()
    return store.get("pt_dist/mesh_secret")
