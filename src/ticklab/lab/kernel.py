"""`ticklab lab build-kernel`: Debian's linux-source-<series> + kernel/patches/<series> + kernel/configs -> bzImage.

A lab kernel is named ``<series>-<variant>`` (``7.2-hz1000``) or ``<variant>`` for the default series
(``hz1000`` is 6.12's; kernel/sources.yaml lists the series and where each source comes from, see
:mod:`ticklab.lab.sources`). The variant is a fragment in kernel/configs merged over guest-base and the
series' own fragment (kernel/configs/sources/<series>.config); the series' patches are
kernel/patches/<series>/*.patch. It is cached in <cache>/kernels/<name>-<key>/, where the key hashes the
source package version (which names the upstream release), every patch and every fragment: change any of
them and the next build is a new kernel.
Builds happen in a temporary directory and are renamed into place only when complete, so an
interrupted build never counts as built.
"""

from __future__ import annotations

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

from tqdm import tqdm

from ..capture.process import kill_group, spawn
from ..paths import cache_dir, repo_root
from . import sources
from .cache import LabError, content_key

# The default series' installed tarball and its top directory (what tests of the 6.12 patches extract).
SOURCE_TARBALL = Path("/usr/src/linux-source-6.12.tar.xz")
SOURCE_TOP = "linux-source-6.12"
BASE_FRAGMENT = "guest-base"
# Objects a guest kernel build compiles; only the progress bar uses it, and a finished build replaces it.
EXPECTED_OBJECTS = 1400
# A build measured on the reference machine (2 cores, -j2): 6 to 18 minutes, depending on what else runs.
REFERENCE_MINUTES = (6, 18)
REFERENCE_JOBS = 2
_OBJECT_LINE = re.compile(r"^\s+(CC|AS|AR|LD|OBJCOPY)\s")
_CONFIG_LINE = re.compile(r"^(CONFIG_\w+)=(.*)$|^# (CONFIG_\w+) is not set$")


def kernel_dir() -> Path:
    return repo_root() / "kernel"


def patch_paths(series: str | None = None) -> list[Path]:
    """The series' patches in the order they apply (the default series' when None)."""
    series = series or sources.load_specs()[0]
    return sorted((kernel_dir() / "patches" / series).glob("*.patch"))


def variants() -> list[str]:
    return sorted(p.stem for p in (kernel_dir() / "configs").glob("*.config") if p.stem != BASE_FRAGMENT)


def kernel_names() -> list[str]:
    """Every lab kernel name: each variant on each series (the default series' by the bare variant)."""
    _, specs = sources.load_specs()
    return [sources.canonical_name(series, variant) for series in specs for variant in variants()]


def fragment_paths(name: str) -> list[Path]:
    """The config fragments of a lab kernel, merged in this order: guest-base, the series', the variant."""
    series, variant = sources.split_name(name)
    if variant not in variants():
        raise LabError(f"kernel/configs/{variant}.config: no such lab kernel variant (have: {', '.join(variants())})")
    own = kernel_dir() / "configs" / "sources" / f"{series}.config"
    return [
        kernel_dir() / "configs" / f"{BASE_FRAGMENT}.config",
        *([own] if own.is_file() else []),
        kernel_dir() / "configs" / f"{variant}.config",
    ]


def patch_files(patch: Path) -> list[str]:
    """The files a patch changes (its '+++ b/...' lines)."""
    return [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)]


def check_patches(source: Path, series: str | None = None) -> list[tuple[Path, bool, str]]:
    """``patch --dry-run`` of every patch, in order, against an unpatched tree: (patch, applies, output)."""
    checked = []
    for patch in patch_paths(series):
        result = subprocess.run(
            ["patch", "-p1", "--dry-run", "--batch", "--forward", "-d", str(source), "-i", str(patch)],
            capture_output=True,
            text=True,
            check=False,
        )
        checked.append((patch, result.returncode == 0, (result.stdout + result.stderr).strip()))
    return checked


def fragment_options(paths: list[Path]) -> dict[str, str]:
    """CONFIG_X -> value ('n' for '# CONFIG_X is not set'), later fragments winning."""
    wanted = {}
    for path in paths:
        for line in path.read_text().splitlines():
            match = _CONFIG_LINE.match(line.strip())
            if match and match.group(1):
                wanted[match.group(1)] = match.group(2)
            elif match:
                wanted[match.group(3)] = "n"
    return wanted


def unmet_options(wanted: dict[str, str], config_text: str) -> list[str]:
    """Options of the fragments that olddefconfig did not keep (a dependency is missing)."""
    have = {}
    for line in config_text.splitlines():
        match = _CONFIG_LINE.match(line.strip())
        if match and match.group(1):
            have[match.group(1)] = match.group(2)
    return [
        f"{name}={value} (got {have.get(name, 'n')})" for name, value in wanted.items() if have.get(name, "n") != value
    ]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class LabKernel:
    variant: str  # the lab kernel's name as experiments give it: hz1000, 7.2-hz1000
    key: str
    directory: Path

    @property
    def image(self) -> Path:
        return self.directory / "bzImage"

    @property
    def info(self) -> dict:
        return json.loads((self.directory / "build.json").read_text())

    def record(self) -> dict:
        info = self.info
        return {
            "variant": self.variant,
            "key": self.key,
            "release": info["release"],
            "hz": info.get("hz"),
            "source": info["source"],
            "patches": info["patches"],
            "bzImage_sha256": info["bzImage_sha256"],
        }


def kernel_key(version: str, name: str) -> str:
    """The cache key of lab kernel ``name`` built from source package ``version``."""
    series, _ = sources.split_name(name)
    parts = [("source", version.encode())]
    parts += [(f"patch/{p.name}", p.read_bytes()) for p in patch_paths(series)]
    parts += [
        (f"config/{p.parent.name}/{p.name}" if p.parent.name == "sources" else f"config/{p.name}", p.read_bytes())
        for p in fragment_paths(name)
    ]
    return content_key(parts)


def kernel_path(name: str, version: str) -> tuple[str, Path]:
    """(key, directory) of lab kernel ``name`` built from source package ``version``."""
    series, variant = sources.split_name(name)
    key = kernel_key(version, name)
    return key, cache_dir() / "kernels" / f"{sources.canonical_name(series, variant)}-{key}"


def cached_kernel(name: str) -> LabKernel | None:
    """The built lab kernel ``name`` of the source here (None when it, or its source, is not here)."""
    series, _ = sources.split_name(name)
    fragment_paths(name)  # an unknown variant is an error, not "not built"
    source = sources.find(series)
    if source is None:
        return None
    key, directory = kernel_path(name, source.version)
    return LabKernel(name, key, directory) if (directory / "build.json").is_file() else None


def shown_dir(path: Path) -> str:
    """A path as a message shows it: ~ for the home directory."""
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def last_build() -> dict | None:
    """The record (build.json) of the most recent lab kernel build that completed here, if any."""
    records = []
    for path in (cache_dir() / "kernels").glob("*/build.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("build_seconds") and record.get("built"):
            records.append(record)
    return max(records, key=lambda r: str(r["built"]), default=None)


def build_estimate(jobs: int | None = None) -> str:
    """How long a build takes here: the reference range scaled to the compile jobs this machine can run
    at once, and the last build's duration when one was recorded."""
    cores = os.cpu_count() or 1
    jobs = jobs or cores
    scale = REFERENCE_JOBS / max(1, min(jobs, cores))
    low, high = (max(1, round(m * scale)) for m in REFERENCE_MINUTES)
    text = f"{low}-{high} min with -j{jobs} on {cores} core{'' if cores == 1 else 's'}"
    last = last_build()
    if last:
        text += f" (last build here: {last['build_seconds'] / 60:.0f} min with -j{last.get('jobs', '?')})"
    return text


def build_announcement(variants: list[str], jobs: int | None = None, no_build_hint: bool = False) -> str:
    """The line said before building: which kernels, how long, where they are kept, how not to build."""
    kernels = f"lab kernel{'s' if len(variants) > 1 else ''} {', '.join(variants)}"
    each = "each " if len(variants) > 1 else ""
    line = (
        f"building {kernels} (not cached): {each}about {build_estimate(jobs)}; "
        f"kept in {shown_dir(cache_dir() / 'kernels')} afterwards"
    )
    if no_build_hint:
        line += "; --no-build refuses instead of building"
    return line


def _run(argv: list[str], log, cwd: Path | None = None) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, check=False)
    if result.returncode != 0:
        raise LabError(f"{log.name}: '{' '.join(argv[:3])} ...' exited {result.returncode}")


def patched_source(source: sources.Source, say=print) -> Path:
    """The extracted, patched source tree for this package version and patch set (made once)."""
    version, patches = source.version, patch_paths(source.series)
    key = content_key([("source", version.encode())] + [(p.name, p.read_bytes()) for p in patches])
    tree = cache_dir() / "src" / f"{version}-{key}"
    if (tree / ".ticklab-patched").is_file():
        return tree
    staging = tree.with_name(tree.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        say(f"extracting {source.tarball} and applying {', '.join(p.name for p in patches) or 'no patches'}")
        subprocess.run(["tar", "-xf", str(source.tarball), "-C", str(staging)], check=True)
        top = staging / source.top
        for patch in patches:
            result = subprocess.run(
                ["patch", "-p1", "--batch", "--forward", "-d", str(top), "-i", str(patch)],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise LabError(
                    f"{patch}: does not apply to {source.package} {version}:\n{result.stdout}{result.stderr}"
                )
        (top / ".ticklab-patched").write_text("".join(f"{p.name}\n" for p in patches))
        top.rename(tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree


def build_kernel(
    variant: str, jobs: int | None = None, progress: bool = True, say=print, force: bool = False, announce: bool = True
) -> LabKernel:
    """The cached lab kernel ``variant`` (a lab kernel name: hz1000, 7.2-hz1000), building it first if needed
    (minutes), after fetching its source when that is not here. With ``announce`` it says that it is cached, or
    before building how long that takes; a caller that said so itself for several kernels passes False."""
    series, _ = sources.split_name(variant)
    fragments = fragment_paths(variant)
    source = sources.require(series, progress=progress, say=say)
    version = source.version
    key, final = kernel_path(variant, version)
    if (final / "build.json").is_file() and not force:
        if announce:
            say(f"lab kernel {variant} is cached: {final}")
        return LabKernel(variant, key, final)
    if announce:
        say(build_announcement([variant], jobs))
    started = time.monotonic()  # build_seconds is all the user waits for, extracting the source included
    tree = patched_source(source, say)
    work = final.with_name(final.name + f".tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    objects = work / "obj"
    objects.mkdir(parents=True)
    jobs = jobs or os.cpu_count() or 1
    make = ["make", "-C", str(tree), f"O={objects}", "ARCH=x86_64"]
    try:
        with (work / "build.log").open("w") as log:
            _run([*make, "tinyconfig"], log)
            _run(
                [
                    str(tree / "scripts" / "kconfig" / "merge_config.sh"),
                    "-m",
                    "-O",
                    str(objects),
                    str(objects / ".config"),
                    *map(str, fragments),
                ],
                log,
                cwd=tree,
            )
            _run([*make, "olddefconfig"], log)
            unmet = unmet_options(fragment_options(fragments), (objects / ".config").read_text())
            if unmet:
                raise LabError(
                    "kernel/configs: options that did not survive olddefconfig (a dependency is off): "
                    + ", ".join(unmet)
                )
            count = _compile(make, jobs, log, progress, variant)
            release = (
                subprocess.run([*make, "-s", "kernelrelease"], capture_output=True, text=True, check=True)
                .stdout.strip()
                .splitlines()[-1]
            )
        shutil.copy2(objects / "arch" / "x86" / "boot" / "bzImage", work / "bzImage")
        shutil.copy2(objects / ".config", work / "config")
        hz = re.search(r"^CONFIG_HZ=(\d+)$", (work / "config").read_text(), re.M)
        info = {
            "variant": variant,
            "key": key,
            "release": release,
            "hz": int(hz.group(1)) if hz else None,
            "series": series,
            "source": source.record(),
            "patches": [{"name": p.name, "sha256": _sha256(p)} for p in patch_paths(series)],
            "fragments": [
                {"name": p.relative_to(kernel_dir() / "configs").as_posix(), "sha256": _sha256(p)} for p in fragments
            ],
            "bzImage_sha256": _sha256(work / "bzImage"),
            "objects": count,
            "jobs": jobs,
            "build_seconds": round(time.monotonic() - started, 1),
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "compiler": subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        }
        (work / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        shutil.rmtree(objects)
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    except BaseException:
        shutil.rmtree(objects, ignore_errors=True)  # keep build.log in the .tmp directory for a look, not the objects
        raise
    say(
        f"lab kernel {variant} ({release} from {source.package} {version}, HZ={info['hz']}) "
        f"built in {info['build_seconds']:.0f} s: {final}"
    )
    return LabKernel(variant, key, final)


def _previous_object_count() -> int:
    counts = [json.loads(p.read_text()).get("objects", 0) for p in (cache_dir() / "kernels").glob("*/build.json")]
    return max([c for c in counts if c] or [EXPECTED_OBJECTS])


def _compile(make: list[str], jobs: int, log, progress: bool, variant: str) -> int:
    argv = [*make, f"-j{jobs}", "bzImage"]
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    count = 0
    # its own session, killed with its process group on an interrupt, and when ticklab dies (spawn's whole_group:
    # sub-makes and compilers included)
    with spawn(
        argv, label="kernel build", whole_group=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        try:
            with tqdm(
                total=_previous_object_count(),
                desc=f"build {variant}",
                unit="obj",
                disable=not progress,
                file=sys.stderr,
            ) as bar:
                for line in process.stdout:
                    log.write(line)
                    if _OBJECT_LINE.match(line):
                        count += 1
                        bar.update(1)
            process.wait()
        finally:
            kill_group(process)
    if process.returncode != 0:
        raise LabError(f"{log.name}: kernel build failed (exit {process.returncode}); the end of the log says why")
    return count
