"""Kernel sources for lab kernels: which series exist (kernel/sources.yaml), which are here, and fetching one.

A series ("6.12", "7.2") is one Debian ``linux-source-<series>`` package. Its tarball is found, in order:
installed (``/usr/src/<package>.tar.xz`` with dpkg's version), or fetched earlier into
``<cache>/sources/<package>/<version>/``; else ``fetch`` gets it from the suite kernel/sources.yaml names
through a private apt configuration (``<cache>/apt/<suite>/``: its own sources list, lists and package cache,
so the system's apt state is neither read for sources nor changed), ``apt-get download`` and ``dpkg-deb -x``.
The version that was used goes into the lab kernel's cache key and its build record.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .. import yamlsafe
from ..paths import cache_dir, repo_root
from .cache import LabError

_SERIES = re.compile(r"^(\d+\.\d+)-(.+)$")
_SUITE = re.compile(r"^[a-z][a-z0-9-]*$")
_PACKAGE = re.compile(r"^linux-source-\d+\.\d+$")
_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:-]*$")


@dataclass(frozen=True)
class SourceSpec:
    """A series as kernel/sources.yaml declares it."""

    series: str
    package: str
    suite: str | None
    mirror: str
    keyring: Path
    why: str = ""


@dataclass(frozen=True)
class Source:
    """A series' source as found here: the tarball, its package version, where it came from."""

    spec: SourceSpec
    version: str
    tarball: Path
    origin: str  # "installed" or "fetched from <mirror> <suite>"

    @property
    def series(self) -> str:
        return self.spec.series

    @property
    def package(self) -> str:
        return self.spec.package

    @property
    def top(self) -> str:
        """The tarball's top directory."""
        return self.spec.package

    def record(self) -> dict:
        return {"package": self.package, "version": self.version, "series": self.series, "origin": self.origin}


def sources_file() -> Path:
    return repo_root() / "kernel" / "sources.yaml"


@functools.lru_cache(maxsize=4)
def _load(path: Path, mtime: float) -> tuple[str, dict[str, SourceSpec]]:
    try:
        data = yamlsafe.load(path.read_text()[: 1 << 20])
    except (OSError, yamlsafe.YamlError) as exc:
        raise LabError(f"{path}: cannot be read ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict) or not data["sources"]:
        raise LabError(f"{path}: needs a 'sources' mapping of series to packages")
    mirror, keyring = str(data.get("mirror") or ""), Path(str(data.get("keyring") or ""))
    if not mirror.startswith(("http://", "https://")):
        raise LabError(f"{path}: mirror: {mirror!r} is not an http(s) URL")
    specs = {}
    for series, entry in data["sources"].items():
        series = str(series)
        if not re.fullmatch(r"\d+\.\d+", series) or not isinstance(entry, dict):
            raise LabError(f"{path}: sources.{series}: a series is '<major>.<minor>' with a mapping")
        package, suite = str(entry.get("package") or ""), entry.get("suite")
        if not _PACKAGE.match(package):
            raise LabError(f"{path}: sources.{series}.package: {package!r} is not linux-source-<major>.<minor>")
        if suite is not None and not _SUITE.match(str(suite)):
            raise LabError(f"{path}: sources.{series}.suite: {suite!r} is not a Debian suite name")
        specs[series] = SourceSpec(
            series, package, None if suite is None else str(suite), mirror, keyring, str(entry.get("why") or "")
        )
    default = str(data.get("default") or "")
    if default not in specs:
        raise LabError(f"{path}: default: {default!r} is not one of the sources ({', '.join(specs)})")
    return default, specs


def load_specs(path: Path | None = None) -> tuple[str, dict[str, SourceSpec]]:
    """(the default series, every series' spec) from kernel/sources.yaml."""
    path = path or sources_file()
    try:
        mtime = path.stat().st_mtime
    except OSError:
        raise LabError(f"{path}: missing (it lists the kernel sources lab kernels build from)") from None
    return _load(path, mtime)


def split_name(name: str) -> tuple[str, str]:
    """A lab kernel's name -> (series, variant): '7.2-hz1000' -> ('7.2', 'hz1000'), 'hz1000' -> (default, 'hz1000')."""
    default, specs = load_specs()
    match = _SERIES.match(name)
    if match:
        if match.group(1) not in specs:
            raise LabError(
                f"lab kernel {name}: no source {match.group(1)} in kernel/sources.yaml (have: {', '.join(specs)})"
            )
        return match.group(1), match.group(2)
    return default, name


def canonical_name(series: str, variant: str) -> str:
    """The one name a lab kernel goes by: the bare variant for the default series, else '<series>-<variant>'."""
    default, _ = load_specs()
    return variant if series == default else f"{series}-{variant}"


def spec(series: str) -> SourceSpec:
    _, specs = load_specs()
    if series not in specs:
        raise LabError(f"no kernel source {series} in kernel/sources.yaml (have: {', '.join(specs)})")
    return specs[series]


def installed(source: SourceSpec) -> Source | None:
    """The system's linux-source package, if installed with its tarball."""
    tarball = Path("/usr/src") / f"{source.package}.tar.xz"
    if not tarball.is_file():
        return None
    try:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", source.package], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    version = result.stdout.strip()
    if result.returncode != 0 or not _VERSION.match(version):
        return None
    return Source(source, version, tarball, "installed")


def fetched_dir(source: SourceSpec) -> Path:
    return cache_dir() / "sources" / source.package


def _newest(versions: list[str]) -> str:
    def compare(a: str, b: str) -> int:
        if a == b:
            return 0
        result = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False)
        return -1 if result.returncode == 0 else 1

    return sorted(versions, key=functools.cmp_to_key(compare))[-1]


def fetched(source: SourceSpec) -> Source | None:
    """The newest copy fetched earlier into the cache, if any (complete ones only: fetched.json is written last)."""
    found = {}
    root = fetched_dir(source)
    for record in root.glob("*/fetched.json") if root.is_dir() else []:
        try:
            info = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        tarball = record.parent / "usr" / "src" / f"{source.package}.tar.xz"
        version = str(info.get("version", ""))
        if isinstance(info, dict) and _VERSION.match(version) and record.parent.name == version and tarball.is_file():
            found[version] = (tarball, info)
    if not found:
        return None
    version = _newest(list(found)) if len(found) > 1 else next(iter(found))
    tarball, info = found[version]
    return Source(source, version, tarball, f"fetched from {info.get('mirror')} {info.get('suite')}")


def find(series: str) -> Source | None:
    """The series' source here (installed, else fetched), without the network."""
    source = spec(series)
    return installed(source) or fetched(source)


def status() -> list[tuple[str, SourceSpec, Source | None]]:
    """Every series: (series, spec, the source here or None)."""
    _, specs = load_specs()
    return [(series, s, installed(s) or fetched(s)) for series, s in specs.items()]


def describe() -> str:
    """One line per series: installed, fetched, or how it would be got (for --help and doctor)."""
    try:
        default, _ = load_specs()
        rows = status()
    except LabError as exc:
        return str(exc)
    lines = []
    for series, source, here in rows:
        name = f"{series}{' (default)' if series == default else ''}"
        if here:
            lines.append(f"{name}: {source.package} {here.version}, {here.origin}: {here.tarball}")
        elif source.suite:
            lines.append(f"{name}: {source.package} not here; the first build fetches it from Debian {source.suite}")
        else:
            lines.append(f"{name}: {source.package} not here; install it with 'apt-get install {source.package}'")
    return "\n".join(lines)


def require(series: str, fetch: bool = True, progress: bool = True, say=print) -> Source:
    """The series' source, fetching it when it is not here and ``fetch`` allows; else a LabError saying how."""
    source = spec(series)
    here = installed(source) or fetched(source)
    if here:
        return here
    if not source.suite:
        raise LabError(f"/usr/src/{source.package}.tar.xz: missing; install it with 'apt-get install {source.package}'")
    if not fetch:
        raise LabError(
            f"{source.package}: not installed and not fetched; 'ticklab lab build-kernel' fetches it "
            f"from Debian {source.suite}"
        )
    return fetch_source(source, progress=progress, say=say)


class AptConfig:
    """A private apt configuration for one suite: ``<cache>/apt/<suite>/`` holds the sources list, the lists and
    the package cache, so nothing of the system's apt state is used or replaced."""

    def __init__(self, source: SourceSpec, root: Path | None = None):
        self.source = source
        self.root = root or cache_dir() / "apt" / str(source.suite)

    def prepare(self) -> None:
        for sub in ("lists/partial", "parts", "cache/archives/partial"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "sources.list").write_text(
            f"deb [signed-by={self.source.keyring}] {self.source.mirror} {self.source.suite} main\n"
        )

    def options(self) -> list[str]:
        # as root apt would hand downloads to its _apt user, who cannot write into root's cache: keep them root's
        sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
        return [
            *sandbox,
            "-o",
            f"Dir::Etc::sourcelist={self.root / 'sources.list'}",
            "-o",
            f"Dir::Etc::sourceparts={self.root / 'parts'}",
            "-o",
            f"Dir::State::Lists={self.root / 'lists'}",
            "-o",
            f"Dir::Cache={self.root / 'cache'}",
            "-o",
            "APT::Get::List-Cleanup=0",
        ]


def _apt_said(result: subprocess.CompletedProcess) -> str:
    """What apt said went wrong, in one bounded line: the reason under its first Err: line (e.g. "Could not
    connect to ..."), else its first E: line, else its first W: line, else its last line."""
    lines = [line.rstrip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith("Err:") and index + 1 < len(lines) and lines[index + 1][:1].isspace():
            return lines[index + 1].strip()[:300]
    said = (
        next((line for line in lines if line.startswith("E:")), None)
        or next((line for line in lines if line.startswith("W:")), None)
        or (lines[-1] if lines else "no output")
    )
    return said.strip()[:300]


def _run(argv: list[str], cwd: Path | None = None, show: bool = False) -> subprocess.CompletedProcess:
    try:
        if show:  # apt draws its own progress on a terminal
            result = subprocess.run(argv, cwd=cwd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, check=False)
            result.stdout = result.stdout or ""
            return result
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise LabError(f"{argv[0]}: cannot run ({exc.strerror}); fetching a kernel source needs apt and dpkg") from None


def candidate(source: SourceSpec, apt: AptConfig) -> str:
    """``apt-get update`` of the private configuration, then the suite's version of the package."""
    for program in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(program) is None:
            raise LabError(f"{program}: not installed; fetching {source.package} needs Debian's apt and dpkg")
    if not source.keyring.is_file():
        raise LabError(f"{source.keyring}: missing; install debian-archive-keyring to fetch {source.package}")
    apt.prepare()
    update = _run(["apt-get", *apt.options(), "update"])
    policy = _run(["apt-cache", *apt.options(), "policy", source.package])
    match = re.search(r"^\s*Candidate:\s*(\S+)", policy.stdout, re.M)
    if not match or match.group(1) == "(none)" or not _VERSION.match(match.group(1)):
        why = (
            _apt_said(update)
            if (update.returncode != 0 or "Err:" in update.stdout or "W:" in update.stderr)
            else f"the suite has no {source.package}"
        )
        raise LabError(f"cannot get {source.package} from {source.mirror} {source.suite}: {why}")
    return match.group(1)


def fetch_source(source: SourceSpec, progress: bool = True, say=print, apt: AptConfig | None = None) -> Source:
    """Fetch the suite's linux-source package into ``<cache>/sources/<package>/<version>/`` (unpacked)."""
    apt = apt or AptConfig(source)
    say(
        f"fetching {source.package} from Debian {source.suite} ({source.mirror}) with a private apt "
        f"configuration in {apt.root}"
    )
    version = candidate(source, apt)
    final = fetched_dir(source) / version
    staging = final.with_name(f".{version}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        say(f"downloading {source.package} {version}")
        show = progress and sys.stderr.isatty()
        download = _run(["apt-get", *apt.options(), "download", f"{source.package}={version}"], cwd=staging, show=show)
        debs = sorted(staging.glob(f"{source.package}_*.deb"))
        if download.returncode != 0 or len(debs) != 1:
            raise LabError(
                f"cannot download {source.package} {version} from {source.mirror} {source.suite}: {_apt_said(download)}"
            )
        deb = debs[0]
        size, digest = deb.stat().st_size, hashlib.sha256()
        with deb.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        say(f"unpacking {deb.name} ({size / 1e6:.0f} MB)")
        unpack = _run(["dpkg-deb", "-x", str(deb), str(staging)])
        tarball = staging / "usr" / "src" / f"{source.package}.tar.xz"
        if unpack.returncode != 0 or not tarball.is_file():
            raise LabError(f"{deb.name}: dpkg-deb -x failed or left no usr/src/{tarball.name}: {_apt_said(unpack)}")
        deb.unlink()
        (staging / "fetched.json").write_text(
            json.dumps(
                {
                    "package": source.package,
                    "version": version,
                    "suite": source.suite,
                    "mirror": source.mirror,
                    "deb": deb.name,
                    "deb_bytes": size,
                    "deb_sha256": digest.hexdigest(),
                    "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=2,
            )
            + "\n"
        )
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    found = fetched(source)
    if found is None or found.version != version:
        raise LabError(f"{final}: fetched, but not found afterwards")
    say(f"fetched {source.package} {version} into {final}")
    return found
