"""`make reproduce` / `ticklab report`: run every notebook with papermill, each in its own process (the claims'
notebooks side by side, one per CPU by default, then the summary, which reads what they wrote), then check and
assemble the output contract (docs/ARCHITECTURE.md, "6. Report output contract"):

    <out>/notebooks/*.ipynb            executed notebooks
    <out>/report/index.html            offline report (+ report/notebooks/*.html)
    <out>/figures/<claim>/<name>.png|.svg, <out>/tables/<claim>/<name>.csv|.md
    <out>/verdicts.csv, <out>/checks.csv (the claims that ran), <out>/summary.json

A notebook that errors, times out, or leaves an expected output missing or empty fails the run.

Every file written here goes through ticklab.safefiles (replaced whole through its directory's descriptor; a link,
hard link, FIFO or device at its name refused with one line); papermill writes each executed notebook itself, to a
name cleared for it first (a regular file of ours removed, anything else refused)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import io
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..importcost import import_jsonschema

import_jsonschema()  # before nbformat imports it: 2.4 s less (importcost)

import jinja2  # noqa: E402
import nbformat  # noqa: E402
import pandas as pd  # noqa: E402

from ..analysis.captured import bundle_health  # noqa: E402
from ..analysis.forest import FOREST  # noqa: E402
from ..claims import SUMMARY_NOTEBOOK, all_claims, get_claim  # noqa: E402
from ..paths import notebooks_dir  # noqa: E402
from ..safefiles import OwnedDir, UnsafeFileError  # noqa: E402
from . import kernelfork, outdir  # noqa: E402
from .firstscreen import HEADLINE_RULE, badge, claim_grid, legend, verdict_table  # noqa: E402
from .notebook import ParameterError, check_parameters  # noqa: E402
from .summary import SUMMARY, collect_checks, collect_verdicts  # noqa: E402


@dataclass
class NotebookResult:
    notebook: str
    claim: str
    status: str  # ok | failed | timeout | missing outputs
    duration_s: float
    outputs: list[str] = field(default_factory=list)
    error: str | None = None


def expected_outputs(claim: str) -> list[str]:
    """Files (relative to the output directory) a claim's notebook must leave behind."""
    if claim == SUMMARY:
        return [
            "figures/summary/published_effects.png",
            "figures/summary/published_effects.svg",
            "tables/summary/published_effects.csv",
            "tables/summary/published_effects.md",
        ]
    declared = get_claim(claim).outputs
    files = [f"figures/{claim}/{name}.{ext}" for name in declared["figures"] for ext in ("png", "svg")]
    files += [f"tables/{claim}/{name}.{ext}" for name in declared["tables"] for ext in ("csv", "md")]
    files += [f"verdicts/{claim}.csv", f"checks/{claim}.csv"]
    return files


def written_outputs(output_dir: Path, claim: str) -> list[str]:
    """Every figure, table and verdict file a claim's notebook wrote: the declared ones and the fresh-data
    ones whose names depend on the setups found (sidecars excluded)."""
    expected = [r for r in expected_outputs(claim) if (output_dir / r).is_file()]
    extra = (
        sorted(
            str(p.relative_to(output_dir))
            for kind in ("figures", "tables")
            for p in (output_dir / kind / claim).glob("*")
            if p.suffix != ".json" and str(p.relative_to(output_dir)) not in expected
        )
        if claim != SUMMARY
        else []
    )
    return expected + extra


def output_problems(output_dir: Path, claim: str) -> list[str]:
    """Missing or empty expected outputs ('empty success' is a failure)."""
    problems = []
    for relative in expected_outputs(claim):
        path = output_dir / relative
        if not path.is_file():
            problems.append(f"{relative}: missing")
        elif path.stat().st_size == 0:
            problems.append(f"{relative}: empty file")
        elif path.suffix == ".csv" and not relative.startswith("checks/") and len(pd.read_csv(path)) == 0:
            problems.append(f"{relative}: header only, no rows")
    return problems


def _failing_cell(executed: Path) -> str | None:
    """Which cell raised, from the executed notebook papermill wrote."""
    if not executed.is_file():
        return None
    book = nbformat.read(executed, as_version=4)
    for index, cell in enumerate(book.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                source = cell.source.strip().splitlines()
                first = source[0] if source else ""
                return f"cell {index} ({first[:60]!r}): {output.get('ename')}: {output.get('evalue')}"
    return None


def run_notebook(
    notebook: Path,
    executed: Path,
    parameters: dict,
    *,
    cell_timeout: int,
    notebook_timeout: int,
    claim: str,
    kernel_server: str | None = None,
) -> NotebookResult:
    # papermill forked from the kernels' fork server, imports done, where there is one (kernelfork.driver_command)
    command = kernelfork.driver_command(
        kernel_server,
        [
            str(notebook),
            str(executed),
            "-k",
            "python3",
            "--engine",
            "ticklab",
            "--execution-timeout",
            str(cell_timeout),
            "--no-progress-bar",
            "--log-level",
            "WARNING",
            "-y",
            json.dumps(parameters),
        ],
    )
    start = time.monotonic()
    try:
        # the report's own server, or none: an address inherited from the report's environment is never passed on
        environment = {k: v for k, v in os.environ.items() if k != kernelfork.SOCKET_ENV}
        if kernel_server:
            environment[kernelfork.SOCKET_ENV] = kernel_server
        proc = subprocess.run(command, capture_output=True, text=True, timeout=notebook_timeout, env=environment)
    except subprocess.TimeoutExpired:
        return NotebookResult(
            notebook.name,
            claim,
            "timeout",
            time.monotonic() - start,
            error=f"did not finish within {notebook_timeout} s",
        )
    duration = time.monotonic() - start
    if proc.returncode != 0:
        where = _failing_cell(executed)
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return NotebookResult(
            notebook.name, claim, "failed", duration, error=where or tail or f"exit {proc.returncode}"
        )
    return NotebookResult(notebook.name, claim, "ok", duration)


def _write(output_dir: Path, relative: str, text: str) -> Path:
    """output_dir/relative holding ``text`` (UTF-8), replaced whole, never through a link (ticklab.safefiles)."""
    with OwnedDir(output_dir) as owned:
        return owned.write_atomic(relative, text.encode("utf-8"))


def _csv_text(frame: pd.DataFrame) -> str:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return buffer.getvalue()


@functools.cache
def _html_exporter():
    """One exporter for the run: its templates are compiled once, not once per notebook."""
    from nbconvert import HTMLExporter  # here: its import runs while the notebooks do, not before them

    exporter = HTMLExporter(template_name="lab", embed_images=True)
    # The report must read offline: no MathJax or require.js from a CDN.
    for trait in (
        "mathjax_url",
        "require_js_url",
        "jquery_url",
        "widget_renderer_url",
        "mermaid_js_url",
        "mermaid_layout_elk_js_url",
    ):
        setattr(exporter, trait, "")
    return exporter


def _export_html(executed: Path, output_dir: Path, relative: str) -> None:
    body, _ = _html_exporter().from_filename(str(executed))
    _write(output_dir, relative, body)


def _sidecar(path: Path) -> dict:
    meta = path.with_suffix(".json")
    return json.loads(meta.read_text()) if meta.is_file() else {}


def _shown_path(path) -> str:
    """A directory as the report names it: relative to the repository when inside it."""
    from ..paths import repo_root

    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(repo_root()))
    except ValueError:
        return str(resolved)


def sources_in_words(sources: list[str]) -> str:
    """A caption's sources by bundle and count (the sidecar keeps the full list)."""
    groups: dict[str, int] = {}
    for source in sources:
        parts = Path(source).parts
        where = (
            "/".join(parts[:4])
            if len(parts) > 4 and parts[0] == "traces" and parts[1] != "published"
            else str(Path(source).parent)
        )
        groups[where] = groups.get(where, 0) + 1
    return "; ".join(f"{where} ({count} file{'s' if count != 1 else ''})" for where, count in groups.items())


def _claim_sections(output_dir: Path, claims: list[str]) -> list[dict]:
    """Per claim its figures and tables; the forest plot (written by the claim's notebook,
    ClaimContext.forest_plot) and its table apart, for the top of the section."""
    sections = []
    for claim in claims:
        figures = []
        for p in sorted((output_dir / "figures" / claim).glob("*.png")):
            meta = _sidecar(p)
            figures.append(
                {
                    "name": p.stem,
                    "png": f"../figures/{claim}/{p.name}",
                    "svg": f"../figures/{claim}/{p.stem}.svg",
                    "json": f"../figures/{claim}/{p.stem}.json",
                    **meta,
                    "sources_words": sources_in_words(meta.get("sources", [])),
                }
            )
        tables = []
        for path in sorted((output_dir / "tables" / claim).glob("*.csv")):
            frame = pd.read_csv(path, keep_default_na=False)
            meta = _sidecar(path)
            tables.append(
                {
                    "name": path.stem,
                    "csv": f"../tables/{claim}/{path.name}",
                    "json": f"../tables/{claim}/{path.stem}.json",
                    "html": frame.to_html(index=False, classes="data", border=0, escape=True, na_rep="—"),
                    **meta,
                    "sources_words": sources_in_words(meta.get("sources", [])),
                }
            )
        forest = next((f for f in figures if f["name"] == FOREST), None)
        if forest is not None:
            forest["table"] = next((t for t in tables if t["name"] == FOREST), None)
        title = "Summary across claims" if claim == SUMMARY else get_claim(claim).title
        sections.append(
            {
                "claim": claim,
                "title": title,
                "forest": forest,
                "figures": [f for f in figures if f["name"] != FOREST],
                "tables": [t for t in tables if t["name"] != FOREST],
            }
        )
    return sections


def write_index(
    output_dir: Path,
    results: list[NotebookResult],
    verdicts: pd.DataFrame | None,
    bundles: pd.DataFrame | None = None,
    checks: pd.DataFrame | None = None,
    *,
    data_dir="traces",
    published_dir="traces/published",
    only: list[str] | None = None,
    claims: list[str] | None = None,
) -> Path:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("ticklab.report", "templates"), autoescape=jinja2.select_autoescape(["html", "j2"])
    )
    template = environment.get_template("report.html.j2")
    claims = claims if claims is not None else [SUMMARY] + [c.id for c in all_claims()]
    grid = None
    if verdicts is not None:
        published = Path(published_dir)
        titles = {c.id: c.title for c in all_claims()}
        declared = {
            c.id: [x.comparison for x in c.comparisons(c.published(published))]
            for c in all_claims()
            if c.id in set(verdicts["claim"])
        }
        grid = claim_grid(verdicts, titles, declared)
    page = template.render(
        results=results,
        grid=grid,
        headline_rule=HEADLINE_RULE,
        legend=legend(),
        nt_badge=badge("not testable here"),
        verdicts=None if grid is None else verdict_table(verdicts, grid["names"]),
        setups=[] if grid is None else sorted((name, setup) for setup, name in grid["names"].items()),
        checks_html=None
        if checks is None or checks.empty
        else checks.drop(columns=["bundle"]).to_html(index=False, classes="data", border=0, na_rep="—"),
        sections=_claim_sections(output_dir, claims),
        bundles=[] if bundles is None else bundles.to_dict("records"),
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        data_dir=_shown_path(data_dir),
        published_dir=_shown_path(published_dir),
        only=only or [],
    )
    return _write(output_dir, "report/index.html", page)


def _last_durations(output_dir: Path) -> dict[str, float]:
    """Seconds each notebook took in the last report written here (its summary.json), where there is one."""
    path = output_dir / "summary.json"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:  # only a plain file of ours
            return {}
        notebooks = json.loads(path.read_text())["notebooks"]
        return {str(n["notebook"]): float(n["duration_s"]) for n in notebooks}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def default_jobs() -> int:
    """Notebooks run at once by default: one per CPU this process may use (each is one busy Python process)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def run_report(
    output_dir: Path | str,
    *,
    data_dir: Path | str,
    published_dir: Path | str,
    only: list[str] | None = None,
    cell_timeout: int = 600,
    notebook_timeout: int = 1800,
    parameters: dict | None = None,
    notebook_dir: Path | None = None,
    jobs: int | None = None,
    log=print,
    kernel_server: str | None = None,
    replace_other: bool = False,
    kernel_fork: bool = True,
) -> int:
    """Run the notebooks and assemble the report. Returns the process exit code (0: all good). ``kernel_server``: the
    socket of a kernel fork server already started (kernelfork.started); else the run starts its own, unless
    ``kernel_fork`` is False or the environment turns it off (kernelfork.enabled)
    ``replace_other``: replace a report of other data in ``output_dir`` (else it is refused, outdir.py)."""
    output_dir = Path(output_dir).resolve()
    order = [c.notebook for c in all_claims()] + [SUMMARY_NOTEBOOK]
    claim_of = {c.notebook: c.id for c in all_claims()} | {SUMMARY_NOTEBOOK: SUMMARY}
    if only:
        unknown = [n for n in only if n not in order and n + ".ipynb" not in order]
        if unknown:
            log(f"error: unknown notebook(s) {unknown}; notebooks are {order}")
            return 2
        wanted = {n if n.endswith(".ipynb") else n + ".ipynb" for n in only}
        order = [n for n in order if n in wanted]
    try:
        check_parameters(parameters or {}, "ticklab report parameters")
    except ParameterError as exc:
        log(f"error: {exc}")
        return 2
    # A full run starts clean, so stale outputs can never satisfy the checks; only files an earlier
    # report wrote are removed (outdir.py), and a directory of someone else's is refused.
    last_durations = _last_durations(output_dir)  # read before a full run clears what the last one wrote
    try:
        read = outdir.data_record(data_dir, published_dir)
        foreign = outdir.claim(output_dir, replace=not only, data=read, replace_other=replace_other)
    except outdir.OutputDirError as exc:
        log(f"error: {exc}")
        return 2
    code = 2
    try:
        code = _run_notebooks(
            output_dir,
            order,
            claim_of,
            data_dir=data_dir,
            published_dir=published_dir,
            cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout,
            parameters=parameters,
            notebook_dir=notebook_dir,
            only=only,
            jobs=jobs,
            log=log,
            last_durations=last_durations,
            kernel_server=kernel_server,
            kernel_fork=kernel_fork,
            progress=lambda: outdir.progress(output_dir, foreign, read),
        )
    except (UnsafeFileError, outdir.OutputDirError) as exc:  # a file it would not write through: one line
        log(f"error: {exc}")
    finally:
        try:
            outdir.record(output_dir, foreign, read)
        except outdir.OutputDirError as exc:
            log(f"error: {exc}")
            code = 2
    return code


def _run_notebooks(
    output_dir: Path,
    order: list[str],
    claim_of: dict,
    *,
    data_dir,
    published_dir,
    cell_timeout,
    notebook_timeout,
    parameters,
    notebook_dir,
    only,
    log,
    jobs=None,
    last_durations=None,
    kernel_server=None,
    kernel_fork: bool = True,
    progress=lambda: None,
) -> int:
    with OwnedDir(output_dir) as owned:
        for sub in ("notebooks", "report/notebooks"):
            owned.mkdirs(sub)

    params = {
        "data_dir": str(Path(data_dir).resolve()),
        "published_dir": str(Path(published_dir).resolve()),
        "output_dir": str(output_dir),
        **(parameters or {}),
    }
    ran = [claim_of[n] for n in order if claim_of[n] != SUMMARY]
    for name in order:
        with OwnedDir(output_dir) as owned:  # papermill writes it in place: only where nothing is
            owned.check_replaceable(f"notebooks/{name}")
            owned.remove(f"notebooks/{name}", missing_ok=True)

    def run(name: str) -> NotebookResult:
        claim = claim_of[name]
        # a summary of a partial run covers the claims that ran, not stale outputs of others
        extra = {"claims": ",".join(ran)} if name == SUMMARY_NOTEBOOK and only else {}
        return run_notebook(
            (notebook_dir or notebooks_dir()) / name,
            output_dir / "notebooks" / name,
            {**params, **extra},
            cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout,
            claim=claim,
            kernel_server=kernel_server,
        )

    def finish(result: NotebookResult, position: int) -> NotebookResult:
        claim, name = result.claim, result.notebook
        if result.status == "ok":
            problems = output_problems(output_dir, claim)
            if problems:
                result.status, result.error = "missing outputs", "; ".join(problems)
        result.outputs = written_outputs(output_dir, claim)
        executed = output_dir / "notebooks" / name
        if executed.is_file():
            _export_html(executed, output_dir, f"report/notebooks/{name.replace('.ipynb', '.html')}")
        log(
            f"[{position}/{len(order)}] {name} {result.status} in {result.duration_s:.1f} s"
            + (f": {result.error}" if result.error else "")
        )
        progress()
        return result

    # The claims' notebooks are independent (each reads bundles and writes its own outputs): they run side by side,
    # a process each; the summary reads what they wrote, so it runs after them.
    # the longest first (by the last run's seconds), so the slowest notebook is not the one left running alone
    claim_notebooks = sorted(
        (n for n in order if n != SUMMARY_NOTEBOOK), key=lambda n: -(last_durations or {}).get(n, 0.0)
    )
    workers = max(1, min(jobs or default_jobs(), len(claim_notebooks) or 1))
    if claim_notebooks:
        log(f"running {len(claim_notebooks)} notebook(s), {workers} at a time: {', '.join(claim_notebooks)}")
    by_name: dict[str, NotebookResult] = {}
    # each notebook's kernel forked from one process that imported what they import (kernelfork)
    server = contextlib.nullcontext(kernel_server) if kernel_server else kernelfork.started(kernel_fork)
    with server as kernel_server, concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        pending = {pool.submit(run, name): name for name in claim_notebooks}
        for done in concurrent.futures.as_completed(pending):
            by_name[pending[done]] = finish(done.result(), len(by_name) + 1)
        # the bundles' health reads only the data directory: worked out while the summary runs on the other core
        health = pool.submit(bundle_health, data_dir, ran or [c.id for c in all_claims()])
        if SUMMARY_NOTEBOOK in order:
            log(f"running {SUMMARY_NOTEBOOK} (reads what the claims' notebooks wrote)")
            by_name[SUMMARY_NOTEBOOK] = finish(run(SUMMARY_NOTEBOOK), len(by_name) + 1)
        bundles = health.result()
    results = [by_name[name] for name in order]

    verdicts = checks = None
    aggregate = SUMMARY_NOTEBOOK in order  # only a run with the summary writes verdicts.csv and checks.csv
    succeeded = [claim_of[r.notebook] for r in results if r.status == "ok" and claim_of[r.notebook] != SUMMARY]
    try:
        verdicts = collect_verdicts(output_dir, ran if aggregate else succeeded) if (aggregate or succeeded) else None
    except FileNotFoundError as exc:
        log(f"error: {exc}")
    checks = collect_checks(output_dir, ran if aggregate else succeeded) if ran else None
    if verdicts is not None:  # a partial run writes the verdicts of the claims it ran (issue 41)
        _write(output_dir, "verdicts.csv", _csv_text(verdicts))
        _write(output_dir, "checks.csv", _csv_text(checks if checks is not None else collect_checks(output_dir, [])))
    for flagged in bundles[bundles["flag"] != ""].itertuples():
        log(f"data: {flagged.host_id}/{flagged.claim}/{flagged.bundle}: {flagged.flag}")
    _write(
        output_dir,
        "summary.json",
        json.dumps(
            {
                "notebooks": [asdict(r) for r in results],
                "verdicts": "verdicts.csv" if verdicts is not None else None,
                "checks": "checks.csv" if verdicts is not None else None,
                "bundles": bundles.to_dict("records"),
            },
            indent=2,
            default=int,
        )
        + "\n",
    )
    index = write_index(
        output_dir,
        results,
        verdicts,
        bundles,
        checks,
        data_dir=data_dir,
        published_dir=published_dir,
        only=[r.notebook for r in results] if only else None,
        claims=([SUMMARY] if aggregate else []) + ran,
    )

    failed = [r for r in results if r.status != "ok"]
    if failed or (aggregate and verdicts is None):
        for r in failed:
            log(f"FAILED {r.notebook}: {r.status}: {r.error}")
        return 1
    log(f"report: {index}")
    return 0
