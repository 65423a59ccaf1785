"""How `ticklab report` runs its notebooks: the claims' side by side (at most --jobs at once), the longest of the
last run first, the summary only after every claim's notebook has ended; and jsonschema imported without the grammar
that cost each process 2.4 s (ticklab.importcost)."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from ticklab.claims import SUMMARY_NOTEBOOK, all_claims
from ticklab.report import build


def test_claims_notebooks_run_at_most_jobs_at_once_longest_first_and_the_summary_last(tmp_path, monkeypatch):
    claims = [c.notebook for c in all_claims()]
    last = {name: float(i) for i, name in enumerate(claims)}  # the last claim's notebook was the slowest
    out = tmp_path / "out"
    lock, running, events, servers = threading.Lock(), set(), [], set()

    def fake_run(notebook, executed, parameters, *, cell_timeout, notebook_timeout, claim, kernel_server):
        with lock:
            servers.add(kernel_server)
            running.add(notebook.name)
            events.append(("start", notebook.name, len(running)))
        time.sleep(0.05)
        with lock:
            running.discard(notebook.name)
            events.append(("end", notebook.name, len(running)))
        return build.NotebookResult(notebook.name, claim, "ok", last.get(notebook.name, 0.0))

    monkeypatch.setattr(build, "run_notebook", fake_run)
    said = []
    build.run_report(out, data_dir=tmp_path, published_dir=tmp_path, jobs=2, log=said.append)  # writes summary.json
    # every notebook, the summary too, had its kernel from the one fork server (report/kernelfork.py), now gone
    (server,) = servers
    assert server.endswith("/kernels.sock") and not Path(server).parent.exists()
    assert [n["duration_s"] for n in json.loads((out / "summary.json").read_text())["notebooks"]][: len(claims)] == [
        last[n] for n in claims
    ], said
    events.clear()
    build.run_report(out, data_dir=tmp_path, published_dir=tmp_path, jobs=1, log=said.append)
    starts = [name for kind, name, _ in events if kind == "start"]
    assert starts == [*reversed(claims), SUMMARY_NOTEBOOK]  # one at a time: the slowest of the last run first
    events.clear()
    build.run_report(out, data_dir=tmp_path, published_dir=tmp_path, jobs=2, log=said.append)
    starts = [name for kind, name, _ in events if kind == "start"]
    assert set(starts[:2]) == {claims[-1], claims[-2]}  # the slowest two, in either order (two threads start them)
    assert max(count for kind, _, count in events if kind == "start") == 2
    assert starts[-1] == SUMMARY_NOTEBOOK
    summary_start = events.index(("start", SUMMARY_NOTEBOOK, 1))
    assert all(kind == "end" or name == SUMMARY_NOTEBOOK for kind, name, _ in events[summary_start - 1 : summary_start])
    assert sum(kind == "end" for kind, _, _ in events[:summary_start]) == len(claims)


def test_jsonschema_imports_without_rfc3987_syntax_and_leaves_it_importable():
    probe = (
        "import sys; import ticklab.schemas as s; "
        "print('jsonschema' in sys.modules, 'rfc3987_syntax' in sys.modules); "
        "s.check({'a': 1}, {'type': 'object', 'required': ['a']}, 'x', ValueError) if hasattr(s, 'check') else None; "
        "import importlib.util; print(importlib.util.find_spec('rfc3987_syntax') is not None)"
    )
    printed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert printed[:2] == ["True", "False"], printed
    if printed[2] == "True":  # installed (jupyter-events' extra): still importable after ticklab's import
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import ticklab.schemas, rfc3987_syntax; "
                "assert rfc3987_syntax.is_valid_syntax('iri', 'http://example.org/a')",
            ],
            check=True,
        )


def test_papermills_launcher_is_papermills_command_line():
    shown = subprocess.run(
        [sys.executable, "-m", "ticklab.report.papermill_main", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "Usage:" in shown and "NOTEBOOK_PATH" in shown
