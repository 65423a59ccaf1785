"""Special files in every input directory (issue 27): a FIFO, a socket, a device, a directory or a symbolic link
where a loader expects a regular file — in a bundle, a published layer, an experiment file, a report's data
directory. Every outcome must be a one-line error or a correct load; a FIFO must never hang a reader (the
campaign's deadline counts that as a hang) and a link inside an input directory is never read through.

A link the user named on the command line (an experiment file given as a link to a real one) may be followed:
the user chose it; what it points at must still be a regular file.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from fuzzcases import REPO, BundleFamily, Outcome, classify, writable_copy

SPECIALS = [
    "fifo",
    "socket",
    "device",
    "directory",
    "link to /dev/zero",
    "link to a root-only file",
    "link to a FIFO",
    "link to a good copy",
    "dangling link",
]


def plant_special(target: Path, special: str, work: Path) -> bool:
    """Replace ``target`` by a special file; True when what is there now is known bad (anything but a regular file
    reached without a link)."""
    good = target.read_bytes() if target.is_file() and not target.is_symlink() else b""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if special == "fifo":
        os.mkfifo(target)
    elif special == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(target))
    elif special == "device":
        target.symlink_to("/dev/null") if os.geteuid() != 0 else os.mknod(target, 0o600 | 0o020000, os.makedev(1, 3))
    elif special == "directory":
        target.mkdir()
    elif special == "link to /dev/zero":
        target.symlink_to("/dev/zero")
    elif special == "link to a root-only file":
        secret = work / "secret-0600"
        secret.write_text("private\n")
        secret.chmod(0o600)
        target.symlink_to(secret)
    elif special == "link to a FIFO":
        fifo = work / "a-fifo"
        if not fifo.exists():
            os.mkfifo(fifo)
        target.symlink_to(fifo)
    elif special == "link to a good copy":
        copy = work / f"good-{target.name}"
        copy.write_bytes(good)
        target.symlink_to(copy)
    elif special == "dangling link":
        target.symlink_to(work / "nowhere")
    return True


class SpecialFilesFamily:
    name = "special files in input directories"
    key = "special-files"

    def prepare(self, seeds: Path) -> None:
        self.bundles = BundleFamily()
        self.bundles.prepare(seeds)
        from ticklab.paths import published_dir

        self.published = seeds / "published-special"
        if not self.published.is_dir():
            shutil.copytree(published_dir(), self.published)
        self.claims = sorted(p.name for p in self.published.iterdir() if (p / "provenance.yaml").is_file())
        self.experiments = sorted((REPO / "runners").glob("*/*.yaml"))

    def case(self, source, work: Path) -> Outcome:
        where = source.choice(["bundle", "published", "experiment", "data dir"])
        special = source.choice(SPECIALS)
        for leftover in ("secret-0600", "a-fifo"):
            if (work / leftover).exists():
                (work / leftover).unlink()
        if where == "bundle":
            call, what = self._bundle(source, special, work)
        elif where == "published":
            call, what = self._published(source, special, work)
        elif where == "experiment":
            call, what = self._experiment(source, special, work)
        else:
            call, what = self._data_dir(source, special, work)
        # a link the user named is theirs to follow; anything else special must be refused
        known_bad = not (where == "experiment" and special == "link to a good copy")
        outcome = classify(call, known_bad=known_bad)
        if outcome.kind == "traceback" and "_Skipped" in outcome.detail:
            outcome = Outcome("wrong", outcome.detail, True)
        if where == "experiment" and special == "link to a good copy" and outcome.kind == "error":
            outcome = Outcome("error", outcome.detail, True)  # refusing a user's link is strict, not wrong
        if outcome.kind == "error" and "private" in outcome.detail:
            outcome = Outcome("wrong", f"an error line shows a refused file's content: {outcome.detail}", True)
        outcome.detail = f"{where} {what} as {special}: {outcome.detail}"
        return outcome

    def _bundle(self, source, special: str, work: Path):
        from ticklab.bundle import load_bundle

        path = writable_copy(self.bundles.seed, work / "bundle")
        what = source.choice(
            ["manifest.json", "manifest.sha256", "results.csv", "raw", "raw/run-003", "raw/run-002/stdout.txt"]
        )
        plant_special(path / what, special, work)
        return (lambda: load_bundle(path)), what

    def _published(self, source, special: str, work: Path):
        from ticklab.analysis.published import load_published

        claim = source.choice(self.claims)
        root = work / "published"
        writable_copy(self.published / claim, root / claim)
        files = sorted(p.name for p in (root / claim).iterdir())
        what = source.choice(files)
        plant_special(root / claim / what, special, work)
        return (lambda: load_published(root, claim)), f"{claim}/{what}"

    def _experiment(self, source, special: str, work: Path):
        from ticklab.capture.experiment import load_experiment

        seed = source.choice(self.experiments)
        path = work / "experiment.yaml"
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.write_bytes(seed.read_bytes())
        plant_special(path, special, work)
        return (lambda: load_experiment(path)), f"{seed.parent.name}/{seed.name}"

    def _data_dir(self, source, special: str, work: Path):
        from ticklab.analysis.captured import find_bundles

        data = work / "data"
        if data.exists():
            for p in [data, *data.rglob("*")]:
                if not p.is_symlink() and p.is_dir():
                    p.chmod(0o755)
            shutil.rmtree(data)
        bundle = data / "fuzz-host" / "nohz" / "20261122T000000Z-ftq"
        bundle.parent.mkdir(parents=True)
        writable_copy(self.bundles.seed, bundle)
        what = source.choice(["manifest.json", "results.csv", "raw/run-001/stdout.txt"])
        plant_special(bundle / what, special, work)

        def load():
            refs = find_bundles(data, "nohz")
            if not refs:
                raise _Skipped("the report's bundle finder skipped the bundle without saying why")
            return [ref.load() for ref in refs]

        return load, f"nohz bundle {what}"


class _Skipped(Exception):
    """A bundle the finder passed over in silence: the campaign counts it as wrong, not as a traceback."""
