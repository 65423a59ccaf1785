"""JupyterLab on the repository: the server starts, serves a notebook through its REST API, and a
kernel session (the registered "ticklab" kernel) executes that notebook's cells; then it stops."""

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from conftest import REPO
from ticklab.capture.process import stop

pytestmark = pytest.mark.slow

websocket = pytest.importorskip("websocket", reason="websocket-client is not installed (make env)")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (make env)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The server is on loopback: never let a proxy from the environment stand in between.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(base: str, token: str, path: str, method: str = "GET", body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{base}{path}",
        data=data,
        method=method,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    with _DIRECT.open(request, timeout=30) as response:
        text = response.read().decode()
    return json.loads(text) if text else {}


def _execute(channel, session: str, code: str, timeout_s: float = 120) -> dict:
    """Run ``code`` in the kernel and wait for its execute_reply, at most ``timeout_s`` in all.

    The deadline is checked after every frame, pings included: the server pings every 30 s, and a plain
    recv() that answers pings by itself would wait for ever on a kernel that never replies."""
    msg_id = uuid.uuid4().hex
    channel.send(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "username": "ticklab-test",
                    "session": session,
                    "msg_type": "execute_request",
                    "version": "5.3",
                    "date": "",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "buffers": [],
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                    "stop_on_error": True,
                },
            }
        )
    )
    deadline = time.monotonic() + timeout_s
    errors = []
    while time.monotonic() < deadline:
        channel.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            opcode, frame = channel.recv_data_frame(True)
        except websocket.WebSocketTimeoutException:
            break
        if opcode != websocket.ABNF.OPCODE_TEXT:
            continue
        message = json.loads(frame.data.decode())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "error":
            errors.append(f"{message['content']['ename']}: {message['content']['evalue']}")
        if message["msg_type"] == "execute_reply":
            return {"status": message["content"]["status"], "errors": errors}
    raise TimeoutError(f"no execute_reply within {timeout_s} s for: {code[:80]}")


def _kernel_state(base: str, token: str, kernel: str) -> str:
    return _request(base, token, f"/api/kernels/{kernel}").get("execution_state", "unknown")


@pytest.mark.timeout(420)
def test_jupyterlab_serves_and_executes_a_notebook_through_a_kernel_session(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ipykernel",
            "install",
            "--sys-prefix",
            "--name",
            "ticklab",
            "--display-name",
            "Python (ticklab)",
        ],
        check=True,
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    # The server's runtime, config and IPython state are this test's own: nothing a user's Jupyter left behind
    # (running servers, config, history databases) takes part, and no proxy is asked for loopback addresses.
    env = {key: value for key, value in os.environ.items() if not key.lower().endswith("_proxy")}
    env.update(
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "jupyterlab.log").open("w")  # a file, not a pipe nobody drains

    def server_log() -> str:
        log.flush()
        return (tmp_path / "jupyterlab.log").read_text()[-3000:]

    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--ServerApp.token={token}",
            f"--ServerApp.root_dir={REPO}",
            "--ServerApp.open_browser=False",
            "--ServerApp.port_retries=0",
            "--allow-root",
            # what this test does not use does not start: language-server discovery, terminals
            "--ServerApp.jpserver_extensions={'jupyter_lsp': False, 'jupyter_server_terminals': False}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                assert "started" in _request(base, token, "/api/status")
                break
            except (OSError, AssertionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"JupyterLab did not start; server log:\n{server_log()}")
                time.sleep(0.5)
        assert "ticklab" in _request(base, token, "/api/kernelspecs")["kernelspecs"]
        notebook = _request(base, token, "/api/contents/notebooks/02-pvspinlock.ipynb")
        assert notebook["type"] == "notebook"
        cells = [c for c in notebook["content"]["cells"] if c["cell_type"] == "code"]
        session = _request(
            base,
            token,
            "/api/sessions",
            "POST",
            {"path": "notebooks/02-pvspinlock.ipynb", "type": "notebook", "kernel": {"name": "ticklab"}},
        )
        kernel = session["kernel"]["id"]
        channel = websocket.create_connection(
            f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?token={token}",
            timeout=120,
            http_no_proxy=["127.0.0.1"],
        )
        try:
            client = uuid.uuid4().hex
            try:
                replies = [_execute(channel, client, cells[0]["source"])]  # the parameters cell
                replies.append(
                    _execute(channel, client, f"output_dir = {str(tmp_path)!r}")
                )  # as papermill would inject
                replies += [_execute(channel, client, cell["source"]) for cell in cells[1:]]
            except TimeoutError as exc:
                raise AssertionError(
                    f"{exc}; kernel state {_kernel_state(base, token, kernel)}; server log:\n{server_log()}"
                ) from exc
        finally:
            channel.close()
            _request(base, token, f"/api/sessions/{session['id']}", "DELETE")
        assert [r["status"] for r in replies] == ["ok"] * len(replies), [r["errors"] for r in replies]
        assert (tmp_path / "verdicts" / "pvspinlock.csv").is_file()
        assert (tmp_path / "figures" / "pvspinlock" / "kernel_build_time.png").is_file()
    finally:
        stop(server, timeout_s=30)
        log.close()
    assert server.returncode is not None
