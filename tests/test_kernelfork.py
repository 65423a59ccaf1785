"""ticklab report's notebook kernels, forked from one server that imported what the notebooks import
(report/kernelfork.py): a kernel per notebook as before, its imports done, its signals and its end its own."""

import contextlib
import os
import time
from pathlib import Path

import papermill  # noqa: F401 (first, as papermill loads its engines: ticklab's among them)
import pytest

from ticklab.report import kernelfork
from ticklab.report.papermill_engine import EncryptedKernelManager

GENEROUS_S = 300  # a bound for a loaded machine, never a timing


def run_cell(client, code: str) -> tuple[dict, str]:
    """(execute_reply content, the cell's printed text)."""
    msg_id = client.execute(code)
    reply = client.get_shell_msg(timeout=GENEROUS_S)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=GENEROUS_S)
    printed = []
    while True:
        message = client.get_iopub_msg(timeout=GENEROUS_S)
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return reply["content"], "".join(printed)


def started_kernel(tmp_path: Path):
    manager = EncryptedKernelManager(kernel_name="python3")
    manager.start_kernel(env={**os.environ, "TICKLAB_PROBE": "from the manager"}, cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=GENEROUS_S)
    return manager, client


@contextlib.contextmanager
def forked_kernel(tmp_path: Path, monkeypatch):
    """A kernel from a fork server of its own, shut down (and the server ended) after the block."""
    with kernelfork.started() as socket_path:
        monkeypatch.setenv(kernelfork.SOCKET_ENV, socket_path)
        manager, client = started_kernel(tmp_path)
        try:
            yield manager, client
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=False)


def served_kernel(tmp_path: Path, monkeypatch, socket_path: str):
    """A kernel of the server at ``socket_path``, its channels closed: (its manager, the kernel's pid)."""
    monkeypatch.setenv(kernelfork.SOCKET_ENV, socket_path)
    manager, client = started_kernel(tmp_path)
    pid = int(run_cell(client, "import os\nprint(os.getpid())")[1])
    client.stop_channels()
    return manager, pid


def ended(manager) -> bool:
    """The kernel command papermill started (the client) has exited (waited for, never a fixed sleep)."""
    deadline = time.monotonic() + GENEROUS_S
    while manager.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not manager.is_alive()


def gone(pid: int) -> bool:
    deadline = time.monotonic() + GENEROUS_S
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True  # exited, its parent not yet told
        except OSError:
            break
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_a_kernel_is_forked_from_the_server_with_the_imports_done_in_its_own_cwd_and_env(tmp_path, monkeypatch):
    with forked_kernel(tmp_path, monkeypatch) as (_, client):
        reply, printed = run_cell(
            client,
            "import os, sys\n"
            "print(open(f'/proc/{os.getppid()}/cmdline').read().split('\\0')[1:4])\n"
            "print('pandas' in sys.modules, os.getcwd(), os.environ['TICKLAB_PROBE'])\n"
            "print(os.getsid(0) == os.getpid())",
        )
    assert reply["status"] == "ok", reply
    parent, state, own_session = printed.splitlines()
    assert parent == "['-m', 'ticklab.report.kernelfork', 'serve']"  # its parent is the fork server
    assert state == f"True {tmp_path} from the manager"  # imports done; the manager's cwd and environment
    assert own_session == "True"  # a terminal's Ctrl-C reaches the report, which ends the server and its kernels


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_an_interrupt_reaches_the_forked_kernel_and_it_goes_on(tmp_path, monkeypatch):
    with forked_kernel(tmp_path, monkeypatch) as (manager, client):
        msg_id = client.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(600)")
        while True:
            message = client.get_iopub_msg(timeout=GENEROUS_S)
            if message["parent_header"].get("msg_id") == msg_id and message["msg_type"] == "stream":
                break
        manager.interrupt_kernel()  # what nbclient does when a cell outlives --execution-timeout
        reply = client.get_shell_msg(timeout=GENEROUS_S)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=GENEROUS_S)
        after, printed = run_cell(client, "print(6 * 7)")
        if after["status"] == "aborted":
            # ipykernel aborts what reached it while it was still stopping on the interrupted cell's error (a loaded
            # machine delays that): the kernel going on is what is tested, so the cell is sent again
            after, printed = run_cell(client, "print(6 * 7)")
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert after["status"] == "ok" and printed == "42\n"


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_a_killed_client_takes_its_kernel_with_it_and_a_kernel_that_exits_ends_its_client(tmp_path, monkeypatch):
    with kernelfork.started() as socket_path:
        manager, kernel = served_kernel(tmp_path, monkeypatch, socket_path)
        client_process = manager.provisioner.process
        client_process.kill()  # SIGKILL: what jupyter_client ends with when a kernel will not shut down
        client_process.wait()
        assert gone(kernel)
        manager.cleanup_resources()
        manager, client = started_kernel(tmp_path)
        client.execute("import os\nos._exit(3)")
        assert ended(manager) and manager.provisioner.process.returncode == 3
        client.stop_channels()


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_the_server_ends_the_kernels_still_running_when_the_report_ends(tmp_path, monkeypatch):
    with kernelfork.started() as socket_path:
        manager, kernel = served_kernel(tmp_path, monkeypatch, socket_path)
    assert gone(kernel)
    assert ended(manager)  # its client saw the server go and ended too
    assert not Path(socket_path).parent.exists()  # the server's private directory is removed


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_without_a_server_the_kernel_starts_as_an_ordinary_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv(kernelfork.SOCKET_ENV, str(tmp_path / "no-server" / kernelfork.SOCKET_NAME))
    manager, client = started_kernel(tmp_path)
    try:
        reply, printed = run_cell(client, "import os\nprint(os.getppid())")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    assert reply["status"] == "ok" and int(printed) == os.getpid()  # the client became the kernel (exec)


@pytest.mark.parametrize(
    "command",
    [
        ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "c.json"],  # another interpreter: its own environment
        ["R", "--slave", "-e", "IRkernel::main()", "--args", "c.json"],  # another kind of kernel
    ],
)
def test_only_an_ipykernel_of_this_interpreter_is_forked(command):
    assert kernelfork.kernel_command(command, "/s/kernels.sock") == command
    import sys

    ours = [sys.executable, "-m", "ipykernel_launcher", "-f", "c.json"]
    assert kernelfork.kernel_command(ours, "/s/kernels.sock") == [
        sys.executable,
        "-I",
        "-S",
        kernelfork.__file__,
        "client",
        "/s/kernels.sock",
        "-f",
        "c.json",
    ]
    assert kernelfork.kernel_command(ours, None) == ours


PAPERMILL_STAND_IN = """
import os, sys, time
import papermill
from ticklab.report.papermill_engine import EncryptedKernelManager
manager = EncryptedKernelManager(kernel_name="python3")
manager.start_kernel()
client = manager.client()
client.start_channels()
client.wait_for_ready(timeout=300)
client.execute("import os; print(os.getpid())")
while True:
    message = client.get_iopub_msg(timeout=300)
    if message["msg_type"] == "stream":
        print(message["content"]["text"].strip(), flush=True)
        break
time.sleep(3600)
"""


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_a_notebook_killed_for_its_timeout_takes_its_forked_kernel_with_it(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys

    with kernelfork.started() as socket_path:
        # what run_notebook's timeout does to papermill: SIGKILL, nothing of it left to shut its kernel down
        stand_in = subprocess.Popen(
            [sys.executable, "-c", PAPERMILL_STAND_IN],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, kernelfork.SOCKET_ENV: socket_path},
        )
        kernel = int(stand_in.stdout.readline())
        assert open(f"/proc/{kernel}/cmdline").read().split("\0")[1:3] == ["-m", "ticklab.report.kernelfork"]
        stand_in.send_signal(signal.SIGKILL)
        stand_in.wait()
        assert gone(kernel)  # its client died with papermill, and the server killed the kernel


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_a_server_that_dies_takes_its_kernels_with_it(tmp_path, monkeypatch):
    import signal

    with kernelfork.started() as socket_path:
        manager, kernel = served_kernel(tmp_path, monkeypatch, socket_path)
        server = int(Path(f"/proc/{kernel}/stat").read_text().split(")")[-1].split()[1])
        os.kill(server, signal.SIGKILL)  # the OOM killer, or started() giving up on it
        assert gone(kernel) and ended(manager)


@pytest.mark.slow  # starts kernels: over a second of CPU (make check leaves it to make test)
def test_a_kernel_started_with_other_start_up_settings_is_an_ordinary_kernel(tmp_path, monkeypatch):
    with kernelfork.started() as socket_path:
        monkeypatch.setenv("PYTHONHASHSEED", "7")  # read at start-up: a fork of the server cannot have it
        manager, kernel = served_kernel(tmp_path, monkeypatch, socket_path)
        try:
            assert int(Path(f"/proc/{kernel}/stat").read_text().split(")")[-1].split()[1]) == os.getpid()
        finally:
            manager.shutdown_kernel(now=False)


def test_papermill_is_forked_from_the_server_where_there_is_one_and_run_as_a_module_where_not():
    import sys

    arguments = ["in.ipynb", "out.ipynb", "-k", "python3"]
    assert kernelfork.driver_command("/s/kernels.sock", arguments) == [
        sys.executable,
        "-I",
        "-S",
        kernelfork.__file__,
        "papermill",
        "/s/kernels.sock",
        *arguments,
    ]
    assert kernelfork.driver_command(None, arguments) == [
        sys.executable,
        "-m",
        "ticklab.report.papermill_main",
        *arguments,
    ]


def _probe_notebook(path: Path, code: str) -> Path:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("probe = None", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(code),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)
    return path


def _run_probe(
    notebook: Path, executed: Path, parameters: dict, server: str | None, notebook_timeout: float = GENEROUS_S
):
    """run_notebook, as ticklab report runs each notebook, for a probe notebook."""
    from ticklab.report.build import run_notebook

    return run_notebook(
        notebook,
        executed,
        parameters,
        cell_timeout=GENEROUS_S,
        notebook_timeout=notebook_timeout,
        claim="probe",
        kernel_server=server,
    )


# the kernel's manager is papermill (JPY_PARENT_PID): its parent's command line, and the kernel's own parent's
PARENTS = (
    "import os\n"
    "def cmdline(pid): return open(f'/proc/{pid}/cmdline').read().split('\\0')[1:4]\n"
    "def parent(pid): return int(open(f'/proc/{pid}/stat').read().split(')')[-1].split()[1])\n"
    "driver = int(os.environ['JPY_PARENT_PID'])\n"
    "print(cmdline(parent(driver)), cmdline(os.getppid()), probe)"
)


@pytest.mark.slow  # runs notebooks: seconds of CPU (make check leaves it to make test)
def test_a_notebook_is_driven_by_a_papermill_forked_from_the_server_and_its_failure_is_reported(tmp_path):
    import nbformat

    good = _probe_notebook(tmp_path / "good.ipynb", PARENTS)
    bad = _probe_notebook(tmp_path / "bad.ipynb", "raise ValueError('planted')")
    with kernelfork.started() as socket_path:
        ran = _run_probe(good, tmp_path / "good-out.ipynb", {"probe": "given"}, socket_path)
        failed = _run_probe(bad, tmp_path / "bad-out.ipynb", {}, socket_path)
    assert ran.status == "ok", ran.error
    printed = nbformat.read(tmp_path / "good-out.ipynb", as_version=4).cells[-1].outputs[0]["text"].strip()
    server = "['-m', 'ticklab.report.kernelfork', 'serve']"
    assert printed == f"{server} {server} given"  # papermill and its kernel both forked from the server
    assert failed.status == "failed" and "ValueError: planted" in failed.error


@pytest.mark.slow  # runs a notebook: seconds of CPU (make check leaves it to make test)
def test_without_a_server_papermill_runs_as_a_process_of_its_own(tmp_path):
    import nbformat

    good = _probe_notebook(
        tmp_path / "good.ipynb", "import os, sys\nprint(os.getppid() == int(os.environ['JPY_PARENT_PID']), probe)"
    )
    ran = _run_probe(
        good, tmp_path / "out.ipynb", {"probe": "given"}, str(tmp_path / "no-server" / kernelfork.SOCKET_NAME)
    )
    assert ran.status == "ok", ran.error
    assert nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[-1].outputs[0]["text"].strip() == "True given"


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _server_of(socket_path: str) -> int:
    directory = str(Path(socket_path).parent)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                arguments = (entry / "cmdline").read_text().split("\0")
                if "serve" in arguments and directory in arguments:  # serve DIRECTORY FD
                    return int(entry.name)
    raise AssertionError(f"no fork server for {socket_path}")


@pytest.mark.slow  # runs a notebook until its timeout
def test_a_notebook_past_its_timeout_leaves_neither_its_papermill_nor_its_kernel(tmp_path):
    sleeper = _probe_notebook(tmp_path / "sleeps.ipynb", "import time\ntime.sleep(3600)")
    with kernelfork.started() as socket_path:
        server = _server_of(socket_path)
        ran = _run_probe(sleeper, tmp_path / "out.ipynb", {}, socket_path, notebook_timeout=15)
        deadline = time.monotonic() + GENEROUS_S
        while _children(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _children(server)
    assert ran.status == "timeout"
    assert not left  # the server killed the papermill it forked; the kernel's client died with it, so its kernel too


def test_a_kernel_shut_down_is_not_interrupted_first(tmp_path):
    """jupyter_client interrupts a kernel before it shuts it down; on a loaded machine that SIGINT can land inside a
    message handler and the kernel logs "KeyboardInterrupt caught in kernel." on papermill's stderr. ticklab's
    manager shuts down without the interrupt, and an interrupt asked for still reaches the kernel."""
    interrupted = tmp_path / "interrupted"
    manager, client = started_kernel(tmp_path)
    try:
        # the handler the kernel restores after this cell (ipykernel's post_handler_hook): it records each SIGINT
        run_cell(
            client,
            "import pathlib\n"
            f"mark = pathlib.Path({str(interrupted)!r})\n"
            "get_ipython().kernel.saved_sigint_handler = lambda *_: mark.write_text(mark.read_text() + 'x' "
            "if mark.exists() else 'x')",
        )
        manager.interrupt_kernel()
        deadline = time.monotonic() + GENEROUS_S
        while not interrupted.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert interrupted.read_text() == "x"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    assert ended(manager)
    assert interrupted.read_text() == "x", "the shutdown sent the kernel a SIGINT"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_the_fork_server_can_be_turned_off(how, monkeypatch):
    """--no-kernel-fork or TICKLAB_KERNEL_FORK=0: no server is started, and the report runs its kernels as before."""
    started_processes = []
    monkeypatch.setattr(kernelfork.subprocess, "Popen", lambda *a, **k: started_processes.append(a))
    monkeypatch.delenv(kernelfork.OFF_ENV, raising=False)
    if how == "environment":
        monkeypatch.setenv(kernelfork.OFF_ENV, "0")
    with kernelfork.started(how != "option") as socket_path:
        assert socket_path is None
    assert started_processes == []


def test_report_no_kernel_fork_reaches_the_run(monkeypatch, tmp_path):
    """`ticklab report --no-kernel-fork` starts no server and tells the run not to start one of its own."""
    from ticklab import cli
    from ticklab.report import build

    monkeypatch.delenv(kernelfork.OFF_ENV, raising=False)
    asked = {}
    monkeypatch.setattr(kernelfork.subprocess, "Popen", lambda *a, **k: pytest.fail("a fork server was started"))
    monkeypatch.setattr(build, "run_report", lambda out, **kwargs: asked.update(kwargs) or 0)
    assert cli.main(["report", "--no-kernel-fork", "--out", str(tmp_path / "report")]) == 0
    assert asked["kernel_fork"] is False
    assert asked["kernel_server"] is None
