"""Writes at every output place ticklab writes as root (issue 40, item 5): one family.

output-places  every place other than ``ingest --out`` (ingest-out-links) where ticklab writes as root:
               ``ticklab seal-manifest``'s manifest.sha256 in a bundle (a small bundle of traces/, its seal removed),
               ``ticklab view``'s cache ($TICKLAB_CACHE/view: the session file ``<bundle>-first.json`` and the trace
               cache ``<digest>-trace.dat`` / ``-tracefs.dat``, with its old ``.part`` name), ``ticklab report --out``
               (summary.json, report/index.html, the executed notebook and its HTML, the marker .ticklab-report and
               its old temporary name; a hollow notebook run in place of papermill, so an input takes well under a
               second), ``make bench --keep DIR``'s DIR/parquet (ingest_speed.fresh_directory, then the tables
               written in it by descriptor) and safefiles' own four writes (write_atomic, write_new, create, append).
               At each of their names, at the directories below the output place and at each write's temporary name,
               another user plants a symbolic link to a victim outside (root's file, mode 0600, known bytes), a
               dangling link, a link to a directory outside, a hard link to the victim, a FIFO, a device node (1,3),
               a directory (holding a link and a hard link to the victim), a regular file where a directory goes, or
               leaves ticklab's own earlier output, or nothing (the baseline) — before the command runs, or (a race)
               in the window between ticklab's check and its write (``safefiles.between_check_and_write``, set in the
               worker). What must hold: the victim keeps its bytes and its mode, nothing appears where a dangling
               link points or anywhere outside, nothing hangs on a FIFO, what was planted is left as it was, no
               temporary file is left behind; a plant at a name ticklab writes is refused in one line naming it (a
               plant accepted is silently accepted: wrong); with nothing planted the write must succeed, and only
               ticklab's own earlier output (or a name it no longer writes) may be written over — always correctly
               (the seal's digest and mode 0444, valid JSON, every table).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import lzma
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fuzzcases import MAX_ERROR_CHARS, REPO, Outcome, classify, tracefs_seed

VICTIM_BYTES = b"someone else's file: root must not write here\n"
OLD_BYTES = b"ticklab's earlier output\n"
TRACE = REPO / "tests" / "data" / "compressed" / "trace-zstd.dat"
PACKED = REPO / "tests" / "data" / "compressed" / "source-trace.dat.xz"
# planted at a file's name / at a directory's name / in the window between the check and the write
FILE_KINDS = [
    "nothing",
    "symlink",
    "dangling symlink",
    "directory symlink",
    "hard link",
    "fifo",
    "device",
    "directory",
    "own earlier output",
]
DIR_KINDS = [
    "symlink",
    "dangling symlink",
    "directory symlink",
    "hard link",
    "fifo",
    "device",
    "regular file",
    "directory",
    "own earlier output",
]
RACE_KINDS = ["symlink", "dangling symlink", "directory symlink", "hard link", "fifo", "device", "directory"]
SITES = ["seal-manifest", "view session", "view trace cache", "report --out", "bench --keep", "safefiles"]


def plant(kind: str, where: Path, victim: Path, nowhere: Path, directory: Path) -> None:
    """Put ``kind`` at ``where``: a link to the victim, to nowhere or to a directory outside, a hard link to the victim,
    a FIFO, a device (/dev/null's numbers as root, else a link to /dev/null), a regular file, or a directory holding
    a link and a hard link to the victim (tests/test_safe_writes.py plants with it too)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        where.symlink_to(victim)
    elif kind == "dangling symlink":
        where.symlink_to(nowhere)
    elif kind == "directory symlink":
        where.symlink_to(directory)
    elif kind == "hard link":
        os.link(victim, where)
    elif kind == "fifo":
        os.mkfifo(where)
        os.chmod(where, 0o644)
    elif kind == "device":
        if os.geteuid() == 0:
            os.mknod(where, stat.S_IFCHR | 0o644, os.makedev(1, 3))  # /dev/null's numbers
            os.chmod(where, 0o644)
        else:
            where.symlink_to("/dev/null")
    elif kind == "regular file":
        where.write_bytes(b"someone else's regular file\n")
    elif kind == "directory":
        where.mkdir()
        (where / "planted-link").symlink_to(victim)
        os.link(victim, where / "planted-hard-link")
    else:
        raise AssertionError(kind)


@dataclass
class Outside:
    """What lies outside every output place: the victim (root's, 0600), a directory, where a dangling link points."""

    root: Path

    def __post_init__(self):
        self.root.mkdir(parents=True)
        self.victim, self.directory, self.nowhere = (
            self.root / "victim",
            self.root / "directory",
            self.root / "created-through-a-dangling-link",
        )
        self.directory.mkdir()
        self.victim.write_bytes(VICTIM_BYTES)
        self.victim.chmod(0o600)

    def plant(self, kind: str, where: Path) -> None:
        plant(kind, where, self.victim, self.nowhere, self.directory)

    def escape(self) -> str | None:
        """What was done outside: the victim written or its mode changed, something created there."""
        info = os.lstat(self.victim)
        if self.victim.read_bytes() != VICTIM_BYTES:
            return "the victim file was written through the planted name"
        if info.st_mode != stat.S_IFREG | 0o600:
            return f"the victim's mode was changed to {stat.filemode(info.st_mode)}"
        if os.path.lexists(self.nowhere):
            return "a file was created where the dangling link points"
        extra = sorted({p.name for p in self.root.iterdir()} - {"victim", "directory"})
        if extra:
            return f"{extra[0]} appeared outside"
        if any(self.directory.iterdir()):
            return "a file was written into the directory outside"
        return None

    def left(self, kind: str, where: Path) -> str | None:
        """What is wrong with what was planted at ``where`` now (it must be left as it was)."""
        try:
            info = os.lstat(where)
        except FileNotFoundError:
            return f"the planted {kind} was removed"
        if kind in ("symlink", "dangling symlink", "directory symlink") or (kind == "device" and os.geteuid()):
            want = {
                "symlink": self.victim,
                "dangling symlink": self.nowhere,
                "directory symlink": self.directory,
                "device": "/dev/null",
            }[kind]
            good = stat.S_ISLNK(info.st_mode) and os.readlink(where) == str(want)
        elif kind == "hard link":
            good = stat.S_ISREG(info.st_mode) and info.st_ino == os.stat(self.victim).st_ino
        elif kind == "fifo":
            good = stat.S_ISFIFO(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644
        elif kind == "device":
            good = (
                stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3) and stat.S_IMODE(info.st_mode) == 0o644
            )
        elif kind == "regular file":
            good = stat.S_ISREG(info.st_mode) and where.read_bytes() == b"someone else's regular file\n"
        elif kind == "directory":
            good = (
                stat.S_ISDIR(info.st_mode)
                and os.path.islink(where / "planted-link")
                and os.lstat(where / "planted-hard-link").st_ino == os.stat(self.victim).st_ino
            )
        else:
            return None
        return None if good else f"the planted {kind} was changed"


@dataclass
class Place:
    """One output place of one input: names relative to ``base``."""

    base: Path
    files: list[str]  # files ticklab writes there
    run: Callable[[], tuple[int, list[str]]]  # (exit code, its refusal lines); raises what the command raises
    check: Callable[[str, str], str | None]  # (name, kind) after a run that wrote: what is wrong with what it wrote
    directories: list[str] = field(default_factory=list)  # directories it makes or opens below base
    unwritten: list[str] = field(default_factory=list)  # names it does not write (any more), or temporary names
    raced: list[str] = field(default_factory=list)  # names whose write calls between_check_and_write first
    race_priors: tuple = ("nothing", "own earlier output")  # what is at a raced name when the command starts
    removes: tuple = ()  # directories it may remove (its last round's): planted there, gone
    own: Callable[[str], None] = None  # put ticklab's own earlier output at a name
    ready: Callable[[], None] = lambda: None  # after planting, before the run


def _temporary(relative: str) -> str:
    """The name safefiles' write_atomic / write_new use beside ``relative`` in this process."""
    parent, name = os.path.split(relative)
    return os.path.join(parent, f".{name}.tmp-{os.getpid()}")


def _cli(argv: list[str]) -> tuple[int, list[str]]:
    """``ticklab`` with ``argv`` in this process: its exit code and what it printed on stderr."""
    from ticklab.cli import main

    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = main(argv)
    return code, errors.getvalue().splitlines()


def _regular(path: Path) -> str | None:
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        return f"{path.name} is not a regular file with one link ({stat.filemode(info.st_mode)}, {info.st_nlink})"
    return None


@contextlib.contextmanager
def _set(target, name: str, value):
    old = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, old)


@contextlib.contextmanager
def _environment(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _clear(root: Path) -> None:
    """Remove a case's tree whatever it holds (read-only directories, FIFOs, devices, links: none followed)."""
    if not os.path.lexists(root):
        return
    for directory, dirs, _ in os.walk(root):
        for name in dirs:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755)
    os.chmod(root, 0o755)
    shutil.rmtree(root)


class OutputPlacesFamily:
    name = "writes at every output place (planted files and races)"
    key = "output-places"

    def prepare(self, seeds: Path) -> None:
        from ticklab.analysis.captured import find_bundles
        from ticklab.bundle import SEAL
        from ticklab.trace.ingest import read_trace

        self.seeds = seeds / "output-places"
        self.seeds.mkdir(exist_ok=True)
        # the smallest sealed bundle in traces/, its seal removed as if sealed by an older ticklab
        sealed = sorted(
            (sum(f.stat().st_size for f in p.parent.rglob("*") if f.is_file()), str(p.parent))
            for p in (REPO / "traces").glob("*/*/*/" + SEAL)
        )
        self.bundle = self.seeds / "bundle" / Path(sealed[0][1]).name
        if not self.bundle.is_dir():
            shutil.copytree(sealed[0][1], self.bundle, copy_function=shutil.copyfile)
            (self.bundle / SEAL).unlink()
        # ticklab view's bundle (as in tests/test_safe_writes.py), with its trace already in a cache to copy from
        refs = [
            r
            for r in find_bundles(REPO / "traces", "hrtick")
            if r.host_id.startswith("guest-") and (r.path / SEAL).is_file()
        ]
        self.view_bundle = refs[0].path if refs else None
        self.view_cache = self.seeds / "view-cache"
        if self.view_bundle is not None and not (self.view_cache / "view").is_dir():
            from ticklab.report.view import build_session

            with _environment("TICKLAB_CACHE", str(self.seeds / "view-cache-made")):
                build_session(self.view_bundle)
            os.rename(self.seeds / "view-cache-made", self.view_cache)
        # the two runs whose traces the view cache holds: xz'd, and a tracefs capture; their cache names and bytes
        self.runs = {"xz": self.seeds / "run-xz", "tracefs": self.seeds / "run-tracefs"}
        if not self.runs["xz"].is_dir():
            self.runs["xz"].mkdir()
            shutil.copyfile(PACKED, self.runs["xz"] / "trace.dat.xz")
        if not self.runs["tracefs"].is_dir():
            shutil.copytree(tracefs_seed(), self.runs["tracefs"])
        self.cached = {}
        for stored, run in self.runs.items():
            made = self.seeds / f"cache-{stored}"
            from ticklab.report.view import trace_file

            with _environment("TICKLAB_CACHE", str(made)):
                path = trace_file(run)
            self.cached[stored] = (path.name, path.read_bytes())
        assert self.cached["xz"][1] == lzma.decompress(PACKED.read_bytes())
        # the report's hollow notebook (tests/test_safe_writes.py's hollow_notebooks), and a data directory without
        # bundles: the report's writes are what is fuzzed
        self.notebooks = self.seeds / "notebooks"
        self.data = self.seeds / "no-data"
        self.data.mkdir(exist_ok=True)
        if not (self.notebooks / "03-hrtick.ipynb").is_file():
            import nbformat

            hollow = nbformat.v4.new_notebook()
            hollow.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
            hollow.cells = [nbformat.v4.new_code_cell("output_dir = 'x'", metadata={"tags": ["parameters"]})]
            self.notebooks.mkdir(exist_ok=True)
            nbformat.write(hollow, self.notebooks / "03-hrtick.ipynb")
        self.tables = sorted(key.replace(":", "__") + ".parquet" for key in read_trace(TRACE).counts())

    # -- the places ---------------------------------------------------------------------------------------------
    def _seal_manifest(self, source, root: Path) -> Place:
        from ticklab.bundle import MANIFEST, SEAL, load_bundle

        bundle = root / "traces" / self.bundle.name
        shutil.copytree(self.bundle, bundle, copy_function=shutil.copyfile)

        def check(name, kind):
            digest = hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest()
            if (bundle / SEAL).read_text() != f"{digest}  {MANIFEST}\n":
                return "the seal does not hold manifest.json's digest"
            if stat.S_IMODE(os.lstat(bundle / SEAL).st_mode) != 0o444:
                return "the seal is not read-only (0444)"
            load_bundle(bundle)
            return _regular(bundle / SEAL)

        def own(name):
            (bundle / SEAL).write_text(hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest() + f"  {MANIFEST}\n")

        return Place(
            bundle,
            [SEAL],
            lambda: _cli(["seal-manifest", str(bundle)]),
            check,
            unwritten=[_temporary(SEAL)],
            raced=[SEAL],
            race_priors=("nothing",),
            own=own,
        )

    def _view_session(self, source, root: Path) -> Place:
        from ticklab.report.view import write_session

        cache = root / "cache"
        name = f"{self.view_bundle.name if self.view_bundle else '20261121T180000Z-ftq'}-first.json"

        def ready():  # the run's trace is in the cache already (a hit): the session is what this input writes
            if self.view_bundle is not None and os.path.isdir(cache / "view") and not os.path.islink(cache / "view"):
                for cached in (self.view_cache / "view").glob("*.dat"):
                    if not os.path.lexists(cache / "view" / cached.name):
                        shutil.copyfile(cached, cache / "view" / cached.name)

        def run():
            with _environment("TICKLAB_CACHE", str(cache)):
                if self.view_bundle is None:  # no bundle to view: the session writer itself
                    write_session({"type": "kshark.config.session"}, cache / "view" / name)
                    return 0, []
                return _cli(["view", str(self.view_bundle), "--session-only"])

        def check(_, kind):
            if json.loads((cache / "view" / name).read_text()).get("type") != "kshark.config.session":
                return "the session file is not a session"
            return _regular(cache / "view" / name)

        def own(relative):
            if relative == "view":
                (cache / "view").mkdir(parents=True)
            else:
                (cache / relative).parent.mkdir(parents=True, exist_ok=True)
                (cache / relative).write_text('{"type": "kshark.config.session"}\n')

        cache.mkdir()
        return Place(
            cache,
            [f"view/{name}"],
            run,
            check,
            directories=["view"],
            unwritten=[_temporary(f"view/{name}")],
            raced=[f"view/{name}"],
            own=own,
            ready=ready,
        )

    def _view_trace(self, source, root: Path) -> Place:
        from ticklab.report.view import trace_file

        stored = source.choice(sorted(self.runs))
        cache = root / "cache"
        name, data = self.cached[stored]
        target = f"view/{name}"
        returned = []

        def run():
            with _environment("TICKLAB_CACHE", str(cache)):
                returned.append(trace_file(self.runs[stored]))
            return 0, []

        def check(name, kind):
            if returned[-1] != cache / target:
                return f"the trace is at {returned[-1]}, not in the cache"
            hit = name == target and kind == "own earlier output"  # a regular file of its own there is a cache hit
            expected = OLD_BYTES if hit else data
            if (cache / target).read_bytes() != expected:
                return "the cached trace does not hold the run's trace"
            return _regular(cache / target)

        def own(relative):
            if relative == "view":
                (cache / "view").mkdir(parents=True)
            else:
                (cache / relative).parent.mkdir(parents=True, exist_ok=True)
                (cache / relative).write_bytes(OLD_BYTES)

        cache.mkdir()
        return Place(
            cache,
            [target],
            run,
            check,
            directories=["view"],
            unwritten=[target + ".part", _temporary(target)],
            raced=[target],
            race_priors=("nothing",),
            own=own,
        )

    def _report(self, source, root: Path) -> Place:
        from ticklab import paths
        from ticklab.report import build, outdir

        out = root / "out"
        outdir.record(out, outdir.claim(out, replace=True))  # a report directory an earlier (empty) report made
        files = [
            "summary.json",
            "report/index.html",
            "notebooks/03-hrtick.ipynb",
            "report/notebooks/03-hrtick.html",
            outdir.MARKER,
        ]

        def papermill(notebook, executed, parameters, *, cell_timeout, notebook_timeout, claim, kernel_server=None):
            import nbformat  # as papermill: the executed notebook written at its name, cleared for it by the report

            nbformat.write(nbformat.read(notebook, as_version=4), str(executed))
            return build.NotebookResult(notebook.name, claim, "ok", 0.0)

        def run():
            log = []
            with _set(build, "run_notebook", papermill):
                code = build.run_report(
                    out,
                    data_dir=self.data,
                    published_dir=paths.published_dir(),
                    only=["03-hrtick"],
                    notebook_dir=self.notebooks,
                    log=log.append,
                )
            errors = [line for line in log if line.startswith("error: ")]
            if code == 1 and not errors:  # ran: the hollow notebook leaves the claim's outputs missing
                return 0, []
            return code, errors

        def check(_, kind):
            if not isinstance(json.loads((out / "summary.json").read_text()).get("notebooks"), list):
                return "summary.json lists no notebooks"
            if "<html" not in (out / "report" / "index.html").read_text().lower():
                return "report/index.html is not the report"
            marker = json.loads((out / outdir.MARKER).read_text())
            if marker.get("writing") or "summary.json" not in marker.get("files", []):
                return f"the marker does not list what the report wrote: {marker}"
            for name in files:
                problem = _regular(out / name)
                if problem:
                    return problem
            return None

        def own(relative):
            if relative in ("report", "notebooks", "report/notebooks"):
                (out / relative).mkdir(parents=True)
            elif relative == outdir.MARKER:
                outdir.record(out, set())
            else:
                (out / relative).parent.mkdir(parents=True, exist_ok=True)
                (out / relative).write_bytes(b"{}\n" if relative == "summary.json" else OLD_BYTES)
                outdir.record(out, set())  # listed in the marker: the earlier report's

        return Place(
            out,
            files,
            run,
            check,
            directories=["report", "notebooks", "report/notebooks"],
            unwritten=[
                ".ticklab-report.tmp",
                _temporary(outdir.MARKER),
                _temporary("summary.json"),
                _temporary("report/index.html"),
            ],
            raced=["summary.json", "report/index.html", "report/notebooks/03-hrtick.html", outdir.MARKER],
            own=own,
        )

    def _bench(self, source, root: Path) -> Place:
        import ingest_speed
        from ticklab.trace.ingest import read_trace, write_tables

        keep = root / "keep"
        keep.mkdir()

        def run():
            try:
                out = ingest_speed.fresh_directory(keep, "parquet")
            except SystemExit as exc:
                if isinstance(exc.code, str):
                    return 2, [exc.code]
                raise
            with out:  # `ticklab ingest --out .` in it, reached by its descriptor (ingest_speed.run)
                write_tables(read_trace(TRACE), f"/proc/self/fd/{out.fd}")
            return 0, []

        def check(_, kind):
            if os.path.islink(keep / "parquet") or not os.path.isdir(keep / "parquet"):
                return "DIR/parquet is not a directory"
            written = sorted(p.name for p in (keep / "parquet").iterdir() if p.name.endswith(".parquet"))
            if written != self.tables:
                return f"DIR/parquet holds {written}"
            return None

        def own(relative):  # the last round's directory, with its tables
            (keep / relative).mkdir()
            (keep / relative / "last-round.parquet").write_bytes(OLD_BYTES)

        return Place(
            keep,
            [],
            run,
            check,
            directories=["parquet"],
            raced=["parquet"],
            race_priors=("nothing", "own earlier output"),
            removes=("parquet",),
            own=own,
        )

    def _safefiles(self, source, root: Path) -> Place:
        from ticklab.safefiles import OwnedDir

        how = source.choice(["write_atomic", "write_new", "create", "append"])
        base = root / "owned"
        base.mkdir()
        target = source.choice(["f", "sub/f"])
        had = []

        def run():
            had.append(
                (base / target).read_bytes()
                if os.path.isfile(base / target) and not os.path.islink(base / target)
                else b""
            )
            with OwnedDir(base) as owned:
                if how == "write_atomic":
                    owned.write_atomic(target, b"new\n")
                elif how == "write_new":
                    owned.write_new(target, b"new\n", mode=0o444)
                elif how == "create":
                    with owned.create(target) as handle:
                        handle.write(b"new\n")
                else:
                    owned.append(target, b"new\n")
            return 0, []

        def check(_, kind):
            want = had[-1] + b"new\n" if how == "append" else b"new\n"
            if (base / target).read_bytes() != want:
                return f"{how} left {(base / target).read_bytes()[:60]!r}"
            if how == "write_new" and stat.S_IMODE(os.lstat(base / target).st_mode) != 0o444:
                return "write_new's file is not mode 0444"
            return _regular(base / target)

        def own(relative):
            if relative == "sub":
                (base / "sub").mkdir()
            else:
                (base / relative).parent.mkdir(parents=True, exist_ok=True)
                (base / relative).write_bytes(OLD_BYTES)

        unwritten = [_temporary(target)] if how in ("write_atomic", "write_new") else []
        return Place(
            base,
            [target],
            run,
            check,
            directories=["sub"] if target == "sub/f" else [],
            unwritten=unwritten,
            raced=[target],
            race_priors=("nothing",) if how == "write_new" else ("nothing", "own earlier output"),
            own=own,
        )

    # -- one input -----------------------------------------------------------------------------------------------
    def case(self, source, work: Path) -> Outcome:
        from ticklab import safefiles

        root = work / "outputs"
        _clear(root)
        root.mkdir(parents=True)
        outside = Outside(root / "outside")
        site = source.choice(SITES)
        place = {
            "seal-manifest": self._seal_manifest,
            "view session": self._view_session,
            "view trace cache": self._view_trace,
            "report --out": self._report,
            "bench --keep": self._bench,
            "safefiles": self._safefiles,
        }[site](source, root)
        name = source.choice(place.files + place.directories + place.unwritten)
        is_dir = name in place.directories
        timing = source.choice(["before", "race"]) if name in place.raced else "before"
        where = place.base / name
        planted: list[Path] = []
        if timing == "before":
            kind = source.choice(DIR_KINDS if is_dir else FILE_KINDS)
            if kind == "nothing":  # the baseline: the command must write, and correctly
                pass
            elif kind == "own earlier output" and name in place.unwritten:  # left by an earlier (older) ticklab
                where.parent.mkdir(parents=True, exist_ok=True)
                where.write_bytes(OLD_BYTES)
            elif kind == "own earlier output":
                place.own(name)
            else:
                if os.path.lexists(where):  # the report's marker: what an earlier report left, replaced by a plant
                    where.unlink()
                outside.plant(kind, where)
            prior = "nothing"
        else:
            kind = source.choice(RACE_KINDS)
            prior = source.choice(list(place.race_priors))
            if prior == "own earlier output":
                if not os.path.lexists(where):
                    place.own(name)
            elif os.path.lexists(where):
                where.unlink()
        place.ready()
        expected = os.path.join(os.path.realpath(where.parent), where.name)

        def hook(path) -> None:
            path = Path(path)
            if planted or os.path.join(os.path.realpath(path.parent), path.name) != expected:
                return
            planted.append(path)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)  # the directory ticklab just made (bench's DIR/parquet)
            elif os.path.lexists(path):
                os.unlink(path)
            outside.plant(kind, where)

        said = {}

        def check(result):
            said["result"] = result
            return None

        window = hook if timing == "race" else safefiles.between_check_and_write
        with _set(safefiles, "between_check_and_write", window):
            outcome = classify(place.run, known_bad=False, check=check, bounded=True)
        if outcome.kind == "accepted":
            code, lines = said["result"]
            if code == 1:
                outcome = Outcome("traceback", f"exit 1, not ticklab's error: {' '.join(lines)[:300]}")
            elif code:
                text = "\n".join(lines)
                if len(lines) != 1 or "Traceback" in text:
                    outcome = Outcome("traceback", f"exit {code} with {len(lines)} lines: {text[:300]!r}")
                elif len(text) > MAX_ERROR_CHARS:
                    outcome = Outcome("wrong", f"unbounded error line ({len(text)} characters): {text[:200]}")
                else:
                    outcome = Outcome("error", text[:300])
        # must it have been refused? a plant at a name ticklab writes (not its own earlier output, not a directory
        # where a directory goes, not a name it no longer writes)
        if timing == "race":
            known_bad = bool(planted) and not (kind == "directory" and is_dir)
        elif name in place.unwritten:
            known_bad = False
        elif is_dir:
            known_bad = kind not in ("directory", "own earlier output")
        else:
            known_bad = kind not in ("nothing", "own earlier output")
        outcome.known_bad = known_bad
        problem = outside.escape()
        if (
            problem is None
            and kind not in ("nothing", "own earlier output")
            and (timing == "before" or planted)
            and not (kind == "directory" and name in place.removes)
        ):
            problem = outside.left(kind, where)
        if problem is None:
            left = sorted(
                str(p.relative_to(place.base))
                for p in place.base.rglob(f".*.tmp-{os.getpid()}")
                if str(p.relative_to(place.base)) != name
            )
            if left:
                problem = f"a temporary file was left behind: {left[0]}"
        if problem is not None:
            outcome = Outcome("wrong", problem, known_bad)
        elif outcome.kind == "error" and str(where) not in outcome.detail and str(where.parent) not in outcome.detail:
            outcome = Outcome("wrong", f"the error does not name {where}: {outcome.detail}", known_bad)
        elif outcome.kind == "error" and kind == "nothing":
            outcome = Outcome("wrong", f"refused with nothing planted: {outcome.detail}", known_bad)
        elif outcome.kind == "accepted" and known_bad:
            outcome = Outcome("wrong", "the planted file was accepted (no error)", known_bad)
        elif outcome.kind == "accepted":
            try:
                problem = place.check(name, kind)
            except Exception as exc:  # what it wrote cannot even be read back
                problem = f"what it wrote cannot be read back: {type(exc).__name__}: {exc}"
            if problem:
                outcome = Outcome("wrong", problem, known_bad)
        race = (
            f"race ({'after ' + prior if prior != 'nothing' else 'nothing before'}"
            + ("" if planted or timing == "before" else ", the window never came")
            + ")"
        )
        outcome.detail = f"{site} {name} {kind} {timing if timing == 'before' else race}: {outcome.detail}"
        return outcome
