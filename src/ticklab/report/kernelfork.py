"""Notebook kernels forked from one process that has imported what the notebooks import (``ticklab report``).

Every notebook ran in a kernel of its own that started Python, imported ipykernel and then pandas, scipy, matplotlib
and ticklab's analysis: about 2.5 s of CPU per notebook before its first cell did any work, six times per report on
two cores. ``ticklab report`` now starts one *fork server* (``serve``): it imports those modules once, then for each
kernel asked of it forks a child that becomes that kernel (``ipykernel.kernelapp.launch_new_instance`` with the
kernel's own arguments, working directory and environment). A fork starts with the imports done; each notebook still
has a kernel and a user namespace of its own, and nothing it does reaches another.

The server forks from its main thread, its only Python thread (no lock a Python thread holds is copied held into a
kernel). The imports start three native threads (measured: 4 tasks in /proc/self/task after them): the OpenBLAS
worker pools of numpy and of scipy, and pyarrow's jemalloc background thread. A child has none of them (fork copies
the calling thread only), and their libraries keep their own state consistent across a fork with pthread_atfork
handlers (OpenBLAS shuts its pool down before the fork and starts it again when next used), as under
multiprocessing's fork start method. It listens on a socket in a private directory (mode 0700) the report made; it
ends, killing any kernel still running, when its standard input closes (the report ended, however it ended).

Off switch: ``ticklab report --no-kernel-fork``, or ``TICKLAB_KERNEL_FORK=0`` in the environment (``make
reproduce`` inherits it), starts no server: every kernel and papermill process then starts as an ordinary one.

papermill asks for a kernel as always (``papermill_engine``); where ``TICKLAB_KERNEL_FORKSERVER`` names the
server's socket, the kernel command it runs is this file as a script (``client``: standard library only, ``-I -S``,
a few milliseconds): it hands the server its standard streams, working directory, environment and arguments, then
stands in for the kernel — a signal it gets (an interrupt, a terminate) goes to the kernel, it exits with the
kernel's status, and if it is killed the server kills the kernel. Where the server cannot be reached the client
becomes an ordinary kernel (``python -m ipykernel_launcher``), so a report is never worse off than before.

The papermill process that drives each notebook is forked from the same server (``driver_command``): starting Python
and importing papermill, nbclient and jupyter_client cost about 1 s of CPU per notebook. Its client
(``kernelfork.py papermill SOCKET ARGUMENT…``) stands in for it as a kernel's does, and falls back to ``python -m
ticklab.report.papermill_main`` where the server cannot be reached.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

SOCKET_ENV = "TICKLAB_KERNEL_FORKSERVER"
OFF_ENV = "TICKLAB_KERNEL_FORK"  # "0": no server (the off switch); the report option is --no-kernel-fork
SOCKET_NAME = "kernels.sock"
# what the notebooks import, in the order their first cells do (importing more is harmless, missing one costs its time)
PREIMPORTS = (
    "ticklab.report.papermill_main",
    "papermill.cli",
    "ticklab.report.papermill_engine",
    "ipykernel.kernelapp",
    "numpy",
    "pandas",
    "scipy.stats",
    "scipy.signal",
    "matplotlib.pyplot",
    "IPython.display",
    "ticklab.report.notebook",
    "ticklab.report.summary",
    "ticklab.analysis.forest",
    "ticklab.analysis.comparisons",
    "ticklab.analysis.verdicts",
)  # then every claim's module (_preimport: from claimids, so a new claim needs no line here)
_MAX_REQUEST = 1 << 20  # a frame's size limit: a request (arguments, environment) is a few KB
MAX_DEPTH = 4  # a frame's nesting limit: a request is {"env": {name: value}, "arguments": [...]}, depth 2
REQUEST_TIMEOUT_S = 10  # a request's read deadline, whole: a byte every few seconds does not hold the server longer
DIRECTORY_PREFIX = "ticklab-kernels-"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STARTUP_PREFIXES = ("PYTHON", "MPL", "OMP_", "OPENBLAS_", "MKL_", "LC_")
STARTUP_NAMES = {"LANG", "LANGUAGE", "TZ", "VIRTUAL_ENV"}
KERNEL, DRIVER = "kernel", "papermill"  # what a forked child becomes: a notebook's kernel, or papermill driving one
FALLBACK = {KERNEL: ["-m", "ipykernel_launcher"], DRIVER: ["-m", "ticklab.report.papermill_main"]}


def _send(connection: socket.socket, message: dict) -> None:
    connection.sendall(json.dumps(message).encode() + b"\n")


def peer_uid(connection: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED: the kernel's word, not the peer's)."""
    _pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return uid


def _depth(frame: bytes) -> int:
    """How deeply the JSON in ``frame`` nests (brackets outside strings): a frame nested past MAX_DEPTH is refused
    before json.loads, whose recursion would end the server."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in frame:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def read_frame(frame: bytes) -> dict:
    """One line of the protocol as a JSON object; ValueError (saying why) for one over the size or depth limits or
    that is not an object."""
    if len(frame) > _MAX_REQUEST:
        raise ValueError(f"a frame of {len(frame)} bytes (at most {_MAX_REQUEST})")
    if _depth(frame) > MAX_DEPTH:
        raise ValueError(f"a frame nested deeper than {MAX_DEPTH}")
    message = json.loads(frame)
    if not isinstance(message, dict):
        raise ValueError("a frame that is not a JSON object")
    return message


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> None:
    """This process is killed when its parent ends (prctl PR_SET_PDEATHSIG); ended now if it already has."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


# -- the client: the kernel command papermill runs -------------------------------------------------------------------
def client(socket_path: str, arguments: list[str], role: str = KERNEL) -> int:
    """Ask the server for a kernel (or a papermill driver, ``role``) with ``arguments`` and stand in for it until it
    ends; become an ordinary one where the server cannot be reached or will not fork this one (a start-up setting that
    differs from its own)."""
    # papermill killed (a notebook's timeout): this client dies with it, and the server kills the kernel
    _die_with_parent(os.getppid())
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_path)
        # the server must be our own user's (SO_PEERCRED) before it gets our environment, arguments and streams: a
        # socket another user put at this name (a directory swapped where TMPDIR is shared) is never answered
        if peer_uid(connection) != os.getuid():
            raise ValueError("the fork server's socket belongs to another user")
        request = {"role": role, "arguments": arguments, "cwd": os.getcwd(), "env": dict(os.environ)}
        socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        replies = connection.makefile("rb")
        int(json.loads(replies.readline(_MAX_REQUEST) or b"{}")["pid"])  # the server forked it
    except (OSError, ValueError, KeyError, TypeError):
        connection.close()
        os.execv(sys.executable, [sys.executable, *FALLBACK[role], *arguments])

    # a signal for the kernel goes through the server, which signals it only while it has not reaped it: a pid this
    # client remembered could, once the kernel had ended, be another process's (jupyter_client interrupts a kernel
    # at every shutdown, and pids wrap at 32768 here)
    def forward(signum, _frame):
        try:
            _send(connection, {"signal": signum})
        except OSError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    while True:
        try:
            line = replies.readline(_MAX_REQUEST)
        except OSError:
            line = b""
        if not line:
            return 1  # the server went away: its kernels went with it
        try:
            status = json.loads(line).get("exit")
        except ValueError:
            return 1
        if isinstance(status, int):
            return status


# -- the server --------------------------------------------------------------------------------------------------------
def _log(line: str) -> None:
    """A line in the report's log (the report's standard error, kept as fd 3 by serve)."""
    try:
        os.write(_LOG_FD, f"ticklab report: kernel fork server: {line}\n".encode(errors="replace"))
    except OSError:
        pass


_LOG_FD = 2


def serve(directory: str, directory_fd: int | None = None) -> None:
    """Listen at ``directory``/kernels.sock, import the notebooks' modules, and fork a kernel for each request, until
    standard input closes. ``directory_fd``: the directory as ``started`` made and checked it, bound through its
    descriptor (no second lookup of its name)."""
    global _LOG_FD
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # ended by the report: its kernels killed and reaped first
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    where = directory if directory_fd is None else f"/proc/self/fd/{directory_fd}"
    listener.bind(os.path.join(where, SOCKET_NAME))
    listener.listen(16)  # bound before the imports: a client that comes early waits in the backlog
    print("listening", flush=True)  # what started() waits for; then nothing more is written there
    _LOG_FD = os.dup(2)  # the report's log; what the imports print goes nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    settings = _startup_settings(os.environ)
    path_head = sys.path[0] if sys.path else None  # python -m puts its working directory first
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # as ipykernel sets it
    _preimport()
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    kernels: dict[socket.socket, int] = {}
    try:
        while True:
            readable, _, _ = select.select([listener, sys.stdin, wakeup_read, *kernels], [], [])
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
                return
            if wakeup_read in readable:
                os.read(wakeup_read, 4096)
            _reap(kernels)
            for connection in [c for c in readable if c in kernels]:
                try:
                    said = connection.recv(4096)
                except OSError:
                    said = b""
                if not said:  # the client is gone (killed): so is its kernel
                    _end(kernels.pop(connection))
                    connection.close()
                    continue
                try:
                    for line in said.splitlines():  # a signal the client got, for its kernel (still unreaped here)
                        signum = read_frame(line).get("signal")
                        if type(signum) is not int or signum not in FORWARDED:
                            raise ValueError(f"not a signal it forwards: {signum!r:.40}")
                        os.kill(kernels[connection], signum)
                except (ValueError, RecursionError, OSError) as exc:  # a bad frame ends this connection only
                    _log(f"a bad frame from the client of kernel {kernels[connection]} ({exc}); its connection ended")
                    _end(kernels.pop(connection))
                    connection.close()
            if listener in readable:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    continue
                try:
                    uid = peer_uid(connection)
                except OSError:
                    uid = -1
                if uid != os.getuid():  # only the user running the report may ask it for a kernel
                    _log(f"a connection from uid {uid}, not {os.getuid()}: refused")
                    connection.close()
                    continue
                connection.settimeout(REQUEST_TIMEOUT_S)  # a client that says nothing holds up no one for long
                stop = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
                signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # no kernel forked and then lost to a signal
                try:
                    pid = _fork_kernel(
                        connection, settings, path_head, [listener, *kernels], [wakeup_read, wakeup_write]
                    )
                    if pid is None:
                        connection.close()
                    else:
                        kernels[connection] = pid
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
    finally:
        for connection, pid in kernels.items():
            _end(pid)
            connection.close()


def _preimport() -> None:
    from ..importcost import import_jsonschema

    import_jsonschema()
    import importlib

    from ..claimids import CLAIM_IDS, module_name

    for name in (*PREIMPORTS, *(f"ticklab.claims.{module_name(claim)}" for claim in CLAIM_IDS)):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the kernel imports it itself, or the notebook says what is missing


def _startup_settings(env) -> dict:
    """The variables Python and the imported libraries read when they start (hash seed, paths, matplotlib's backend,
    BLAS threads, locale, time zone): a kernel whose differ from the server's cannot be forked from it."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(STARTUP_PREFIXES) or k.endswith("_NUM_THREADS") or k in STARTUP_NAMES
    }


def _fork_kernel(connection, settings: dict, path_head, sockets: list, fds_to_close: list) -> int | None:
    """Fork a kernel for the request on ``connection``; None (the client then starts an ordinary kernel) for a request
    that cannot be read or whose start-up settings differ from the server's."""
    received: list[int] = []
    message = b""
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    try:
        message, received, _, _ = socket.recv_fds(connection, _MAX_REQUEST, 3)
        while not message.endswith(b"\n") and len(message) <= _MAX_REQUEST:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ValueError(f"a request not read within {REQUEST_TIMEOUT_S} s")
            connection.settimeout(left)
            more = connection.recv(_MAX_REQUEST)
            if not more:
                break
            message += more
        request = read_frame(message)
        arguments, cwd, env = list(request["arguments"]), str(request["cwd"]), dict(request["env"])
        role = request.get("role", KERNEL)
        if (
            len(received) != 3
            or role not in FALLBACK
            or not all(isinstance(a, str) for a in arguments)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            raise ValueError("malformed request")
        if _startup_settings(env) != settings:
            raise ValueError("start-up settings differ from the server's")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        if received or message.strip():  # not a client that connected and closed without asking
            _log(f"a request refused ({' '.join(str(exc).split())[:200] or type(exc).__name__}); its connection ended")
        for fd in received:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become(role, server, arguments, cwd, env, received, path_head, [connection, *sockets], fds_to_close)
    for fd in received:
        os.close(fd)
    try:
        _send(connection, {"pid": pid})
    except OSError:
        _end(pid)
        return None
    return pid


def _become(role, server, arguments, cwd, env, fds, path_head, sockets, fds_to_close) -> None:
    status = 1
    try:
        _die_with_parent(server)  # a server that dies takes its kernels with it
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
        for connection in sockets:
            connection.close()
        for fd in fds_to_close:
            os.close(fd)
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        if path_head is not None and sys.path and sys.path[0] == path_head:
            sys.path[0] = cwd  # what python -m ipykernel_launcher in the kernel's cwd puts first
        import random

        import numpy

        random.seed()  # a kernel of its own draws as a fresh process would, not as its siblings
        numpy.random.seed()
        if role == DRIVER:
            from .papermill_main import main

            sys.argv = ["papermill", *arguments]
            main()
        else:
            # ipykernel read JPY_PARENT_PID when the server imported it: the kernel's own, so that it watches its
            # manager
            parent = env.get("JPY_PARENT_PID", "")
            sys.argv = [
                "ipykernel_launcher",
                *arguments,
                *([f"--IPKernelApp.parent_handle={parent}"] if parent.isdigit() else []),
            ]
            from ipykernel import kernelapp

            kernelapp.launch_new_instance()
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a kernel that failed to start: say why where papermill reads its stderr
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _reap(kernels: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for connection, kernel in list(kernels.items()):
            if kernel == pid:
                del kernels[connection]
                try:
                    _send(connection, {"exit": os.waitstatus_to_exitcode(status) % 256})
                except OSError:
                    pass
                connection.close()


def _end(pid: int) -> None:
    """Kill a kernel and reap it (under an init that does not reap, it would stay a zombie)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _safe_parent(path: str) -> int | None:
    """A descriptor on the directory ``path`` when no other user can put or swap a name in it: it belongs to root or
    to us and is writable by no one else unless sticky (as /tmp is); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    info = os.fstat(fd)
    if info.st_uid in (0, os.getuid()) and (not info.st_mode & 0o022 or info.st_mode & stat.S_ISVTX):
        return fd
    os.close(fd)
    return None


@contextlib.contextmanager
def _private_directory():
    """(path, descriptor) of a new directory of ours, mode 0700, made exclusively (mkdir) under a parent no other user
    can swap it in (TMPDIR's, else /tmp), opened O_NOFOLLOW through the parent's descriptor and checked by it; removed
    through the descriptors at the end. (None, None) where there is no such parent."""
    parent = None
    for candidate in dict.fromkeys((tempfile.gettempdir(), "/tmp")):
        parent = _safe_parent(candidate)
        if parent is not None:
            break
    if parent is None:
        yield None, None
        return
    name = DIRECTORY_PREFIX + os.urandom(8).hex()
    fd = None
    try:
        os.mkdir(name, 0o700, dir_fd=parent)  # exclusive: an existing name is an error, never reused
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise OSError(f"{name}: not a private directory of ours")
    except OSError:
        if fd is not None:
            os.close(fd)
        os.close(parent)
        yield None, None
        return
    try:
        yield os.path.join(candidate, name), fd
    finally:
        with contextlib.suppress(OSError):
            os.unlink(SOCKET_NAME, dir_fd=fd)
        with contextlib.suppress(OSError):
            found = os.lstat(name, dir_fd=parent)
            if (found.st_dev, found.st_ino) == (info.st_dev, info.st_ino):
                os.rmdir(name, dir_fd=parent)
        os.close(fd)
        os.close(parent)


def trusted_address(socket_path: str | None) -> str | None:
    """``socket_path`` where it is a socket of ours in a directory of ours that no one else can enter (what
    ``started`` makes); None otherwise (an address inherited from elsewhere is not used)."""
    if not socket_path:
        return None
    try:
        directory, socket_info = os.lstat(os.path.dirname(socket_path)), os.lstat(socket_path)
    except (OSError, ValueError):
        return None
    ours = directory.st_uid == os.getuid() and socket_info.st_uid == os.getuid()
    private = stat.S_ISDIR(directory.st_mode) and not stat.S_IMODE(directory.st_mode) & 0o077
    return socket_path if ours and private and stat.S_ISSOCK(socket_info.st_mode) else None


def enabled(asked: bool = True) -> bool:
    """Whether a report starts a fork server: asked for (not --no-kernel-fork) and not turned off in the environment."""
    return asked and os.environ.get(OFF_ENV, "").strip() != "0"


@contextlib.contextmanager
def started(asked: bool = True):
    """A fork server for this report's kernels, ended with the block: yields its socket's path (None: no server,
    also where it is turned off: ``enabled``)."""
    if not enabled(asked):
        yield None
        return
    with _private_directory() as (directory, directory_fd):
        if directory is None:
            yield None
            return
        server = subprocess.Popen(
            [sys.executable, "-m", "ticklab.report.kernelfork", "serve", directory, str(directory_fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(directory_fd,),
        )
        assert server.stdin is not None and server.stdout is not None  # both PIPE
        try:
            # its socket bound (a fraction of a second): a kernel asked for after this line waits for the server's
            # imports, not for nothing; a server that failed to start says nothing, and kernels start as before
            listening = server.stdout.readline() == b"listening\n"
            server.stdout.close()
            yield os.path.join(directory, SOCKET_NAME) if listening else None
        finally:
            server.stdin.close()  # how a server learns that a report killed outright has gone
            server.terminate()  # this one ends now, even midway through its imports, its kernels killed first
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def kernel_command(command: list[str], socket_path: str | None) -> list[str]:
    """``command`` (an ipykernel kernel's, as jupyter_client formatted it) as a client of the fork server at
    ``socket_path``; unchanged where there is none, or for a kernel of another interpreter or another kind."""
    if not socket_path or len(command) < 3 or command[1:3] != ["-m", "ipykernel_launcher"]:
        return command
    if os.path.abspath(command[0]) != os.path.abspath(sys.executable):  # a venv's python, not what it links to
        return command
    return client_command(socket_path) + command[3:]


def driver_command(socket_path: str | None, arguments: list[str]) -> list[str]:
    """The command that runs papermill with ``arguments`` for ``ticklab report``: forked from the server at
    ``socket_path`` (this file as a script, standard library only), or ``python -m ticklab.report.papermill_main``
    where there is none."""
    if not socket_path:
        return [sys.executable, *FALLBACK[DRIVER], *arguments]
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), DRIVER, socket_path, *arguments]


def client_command(socket_path: str) -> list[str]:
    """The kernel command for papermill: this file run as a script by this interpreter, standard library only."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), "client", socket_path]


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "client":
        sys.exit(client(sys.argv[2], sys.argv[3:]))
    if len(sys.argv) >= 3 and sys.argv[1] == DRIVER:
        sys.exit(client(sys.argv[2], sys.argv[3:], DRIVER))
    if len(sys.argv) in (3, 4) and sys.argv[1] == "serve":
        try:
            serve(sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else None)
        finally:
            # its kernels were ended in serve(); an interpreter's teardown of everything it imported took 0.5 s of
            # every report's wall time, and nothing in this process needs it
            os._exit(0)
    print(
        "usage: kernelfork.py serve DIRECTORY [FD] | client SOCKET ARGUMENT... | papermill SOCKET ARGUMENT...",
        file=sys.stderr,
    )
    sys.exit(2)
