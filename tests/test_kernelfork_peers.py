"""Issue 55 item 4: the report's kernel fork server trusts neither its directory nor its peer. Only the user running
the report may ask it for a kernel (SO_PEERCRED), the client hands its streams only to a server of its own user, a
bad frame ends that connection only with a line in the report's log, the directory is made under a parent no other
user can swap it in, and an address the report did not set is not used."""

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import papermill  # noqa: F401 (first, as papermill loads its engines: ticklab's among them)
import pytest

from ticklab.report import kernelfork
from ticklab.report.papermill_engine import EncryptedKernelManager

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def request(arguments: list[str], env: dict | None = None) -> bytes:
    return (
        json.dumps({"role": "kernel", "arguments": arguments, "cwd": os.getcwd(), "env": env or dict(os.environ)})
        + "\n"
    ).encode()


def connect(socket_path: str) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(socket_path)
    return connection


def reply(connection: socket.socket) -> bytes:
    """What the server says before it closes the connection or sends a line."""
    received = b""
    while not received.endswith(b"\n"):
        piece = connection.recv(4096)
        if not piece:
            break
        received += piece
    return received


def still_serving(socket_path: str) -> bool:
    """The server still accepts (a dead one leaves its socket, and connect is refused)."""
    try:
        connect(socket_path).close()
    except ConnectionRefusedError:
        return False
    return True


@pytest.mark.slow  # starts a fork server: seconds of CPU (make check leaves it to make test)
def test_bad_frames_end_their_connection_only_with_a_line_in_the_log(tmp_path, capfd):
    with kernelfork.started() as socket_path, open(os.devnull, "rb+") as null:
        assert socket_path
        nested = connect(socket_path)  # json.loads' recursion ended the server, silently, with exit 0
        socket.send_fds(nested, [b"[" * 200_000 + b"]" * 200_000 + b"\n"], [null.fileno()] * 3)
        assert reply(nested) == b""
        assert still_serving(socket_path)

        kernel = connect(socket_path)  # a real kernel, then a signal frame that is no signal number
        socket.send_fds(kernel, [request(["-f", str(tmp_path / "kernel.json")])], [null.fileno()] * 3)
        pid = json.loads(reply(kernel))["pid"]
        kernel.sendall(b'{"signal": 2.0}\n')  # os.kill(pid, 2.0): a TypeError that ended the server and its kernels
        assert reply(kernel) == b""  # this connection ended, its kernel with it
        assert still_serving(socket_path)
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    log = capfd.readouterr().err
    assert log.count("ticklab report: kernel fork server: ") == 2, log
    assert "nested deeper than" in log and "not a signal it forwards: 2.0" in log


@pytest.mark.slow  # starts a fork server: seconds of CPU (make check leaves it to make test)
@needs_root
def test_only_the_user_running_the_report_gets_a_kernel(tmp_path):
    """Where its directory is reachable by another user, that user's request is refused by SO_PEERCRED: before, the
    server forked them a kernel running as the report's user with their arguments."""
    with kernelfork.started() as socket_path:
        os.chmod(os.path.dirname(socket_path), 0o711)
        os.chmod(socket_path, 0o777)
        script = (
            "import os, socket, sys\n"
            f"os.setgid({NOBODY}); os.setuid({NOBODY})\n"
            "c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1])\n"
            "null = os.open(os.devnull, os.O_RDWR)\n"
            "socket.send_fds(c, [sys.stdin.buffer.read()], [null] * 3)\n"
            "got = b''\n"
            "while not got.endswith(b'\\n'):\n"
            "    try: piece = c.recv(4096)\n"
            "    except ConnectionResetError: piece = b''\n"
            "    if not piece: break\n"
            "    got += piece\n"
            "sys.stdout.write(got.decode())\n"
        )
        asked = subprocess.run(
            [sys.executable, "-c", script, socket_path],
            input=request(["-f", str(tmp_path / "kernel.json")]),
            capture_output=True,
        )
        assert asked.returncode == 0, asked.stderr
        assert asked.stdout == b""  # no {"pid": ...}: nothing forked for them


@pytest.mark.slow  # starts a fork server: seconds of CPU (make check leaves it to make test)
@needs_root
def test_the_client_hands_nothing_to_a_server_of_another_user(tmp_path):
    """A socket another user put where the report's server should be got root's environment, arguments and
    standard streams; now the client checks the server's uid first and starts an ordinary kernel instead."""
    theirs = Path(tempfile.mkdtemp(prefix="ticklab-test-theirs-", dir="/tmp"))  # reachable by another user
    theirs.chmod(0o755)
    os.chown(theirs, NOBODY, NOBODY)
    got = theirs / "got"
    fake = (
        "import os, socket, sys\n"
        f"os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(1)\n"
        "print('listening', flush=True)\n"
        "c, _ = s.accept()\n"
        "data = b''\n"
        "while True:\n"
        "    piece = c.recv(65536)\n"
        "    if not piece: break\n"
        "    data += piece\n"
        "    if data.endswith(b'\\n'): break\n"
        "open(sys.argv[2], 'wb').write(data)\n"
    )
    sock = str(theirs / "kernels.sock")
    server = subprocess.Popen([sys.executable, "-c", fake, sock, str(got)], stdout=subprocess.PIPE)
    try:
        assert server.stdout.readline() == b"listening\n"
        client = subprocess.run(
            [*kernelfork.client_command(sock), "--version"],
            capture_output=True,
            env={**os.environ, "TICKLAB_SECRET_PROBE": "root's environment"},
        )
        assert client.returncode == 0  # an ordinary kernel's --version
        assert server.wait(timeout=300) == 0
        assert b"root's environment" not in got.read_bytes()
    finally:
        server.kill()
        shutil.rmtree(theirs)


@pytest.mark.slow  # starts a fork server: seconds of CPU (make check leaves it to make test)
def test_the_directory_is_never_made_where_another_user_could_swap_it(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by everyone, not sticky
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    with kernelfork.started() as socket_path:
        assert socket_path and not socket_path.startswith(str(shared))
        directory = os.lstat(os.path.dirname(socket_path))
        assert directory.st_uid == os.getuid() and stat.S_IMODE(directory.st_mode) == 0o700
    assert not os.path.lexists(socket_path) and not os.path.lexists(os.path.dirname(socket_path))


def test_the_engine_ignores_an_address_the_report_did_not_set(tmp_path, monkeypatch):
    planted = tmp_path / "planted"
    planted.mkdir()
    planted.chmod(0o777)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(planted / "kernels.sock"))
    monkeypatch.setenv(kernelfork.SOCKET_ENV, str(planted / "kernels.sock"))
    manager = EncryptedKernelManager(kernel_name="python3")
    command = manager.format_kernel_cmd()
    assert "client" not in command and command[1:3] == ["-m", "ipykernel_launcher"]
    listener.close()
