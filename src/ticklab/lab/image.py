"""`ticklab lab build-image`: the guest's root filesystem, a gzip'd newc initramfs (runners/vm/image.yaml).

The image is assembled in a staging tree: the recipe's programs with the shared libraries they load
(from ``ldd``), busybox's applet links, a trimmed Python standard library, the Python modules the
guest side of ticklab imports, ticklab itself, and runners/vm/init as /init. Every file gets
mtime 0 and owner root, and the archive is written in sorted order with GNU cpio --reproducible and
gzip mtime 0, so the same inputs give the same bytes. It is cached by a key over every input file.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..paths import cache_dir, repo_root
from .cache import LabError, content_key

RECIPE = Path("runners/vm/image.yaml")
GUEST_REPO = Path("opt/ticklab")
# Debian 12 has a merged /usr: these top-level names are links into /usr in the image too.
MERGED = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def recipe() -> dict:
    path = repo_root() / RECIPE
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LabError(f"{path}: cannot read the image recipe ({exc})") from exc
    missing = [k for k in ("programs", "python", "ticklab", "init") if k not in (data or {})]
    if missing:
        raise LabError(f"{path}: missing key(s) {', '.join(missing)}")
    return data


def packages(data: dict | None = None) -> list[str]:
    """The Debian packages the image's programs come from (the recipe's ``packages``): what .ci/run installs."""
    return [str(name) for name in (data or recipe()).get("packages", [])]


def missing_programs(data: dict | None = None) -> list[str]:
    """The recipe's programs (and cpio, which packs the image) not installed here; empty when an image can be built."""
    names = [str(name) for name in (data or recipe())["programs"]] + ["cpio"]
    return [name for name in names if not (shutil.which(name) if "/" not in name else os.access(name, os.X_OK))]


def _canonical(path: str) -> str:
    """The path inside the image, with merged-/usr top-level links resolved ('/lib/x' -> 'usr/lib/x')."""
    relative = path.lstrip("/")
    top, _, rest = relative.partition("/")
    return f"{MERGED[top]}/{rest}" if top in MERGED and rest else relative


def _program(name: str) -> Path:
    found = shutil.which(name) if "/" not in name else (name if os.access(name, os.X_OK) else None)
    if not found:
        raise LabError(
            f"{RECIPE}: program {name!r} is not installed on this host "
            f"(see 'packages' in {RECIPE} for the Debian packages to install)"
        )
    return Path(found)


def shared_libraries(binary: Path) -> list[str]:
    """The shared objects ``binary`` loads (its interpreter included); none for a static binary."""
    result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    return sorted(set(_LDD_PATH.findall(result.stdout))) if result.returncode == 0 else []


def _is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


@dataclass
class Inputs:
    """What goes into the image: image path -> host file, image path -> link target."""

    files: dict[str, Path]
    links: dict[str, str]

    def add_file(self, host_path: str | Path, image_path: str | None = None) -> None:
        host_path = Path(host_path)
        real = host_path.resolve()
        target = image_path or _canonical(str(real))
        self.files[target] = real
        if image_path is None and _canonical(str(host_path)) != target:
            self.links[_canonical(str(host_path))] = "/" + target


def _python_module_files(name: str) -> list[tuple[Path, str]]:
    """(file in this environment, its path under the guest's site directory) for a package or a one-file module
    (typing_extensions)."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        return [
            (path, str(Path(name) / path.relative_to(root)))
            for path in sorted(root.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
        ]
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        return [(Path(spec.origin), Path(spec.origin).name)]
    raise LabError(f"{RECIPE}: python module {name!r} is not in this environment (run 'make env')")


def gather(data: dict) -> Inputs:
    inputs = Inputs({}, {})
    elves = []
    for name in data["programs"]:
        path = _program(str(name))
        inputs.add_file(path)
        elves.append(path)
    for name in data.get("files", []):
        if Path(name).is_file():
            inputs.add_file(name)
    python = data["python"]
    stdlib = Path(python["stdlib"])
    excluded = set(python.get("stdlib_exclude", []))
    for path in sorted(stdlib.rglob("*")):
        parts = path.relative_to(stdlib).parts
        if parts[0] in excluded or not path.is_file() or path.is_symlink():
            continue
        inputs.add_file(path)
        if path.suffix == ".so":
            elves.append(path)
    for module in python.get("modules", []):
        for path, under_site in _python_module_files(str(module)):
            inputs.add_file(path, str(GUEST_REPO / "site" / under_site))
            if path.suffix == ".so":
                elves.append(path)
    repo = repo_root()
    for entry in data["ticklab"]:
        source = repo / entry
        if not source.exists():
            raise LabError(f"{source}: missing (run 'make tools' for tools/bin)")
        paths = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts:
                continue
            inputs.add_file(path, str(GUEST_REPO / path.relative_to(repo)))
            if _is_elf(path):
                elves.append(path)
    inputs.add_file(repo / data["init"], "init")
    for binary in elves:
        for library in shared_libraries(binary):
            inputs.add_file(library)
    return inputs


def busybox_links(busybox: Path) -> dict[str, str]:
    result = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True)
    return {_canonical(line.strip()): "/usr/bin/busybox" for line in result.stdout.splitlines() if line.strip()}


def image_key(inputs: Inputs) -> str:
    # this module is part of the recipe: a change in how the tree is staged is a new image
    parts = [("builder", Path(__file__).read_bytes())]
    parts += [(f"file:{target}", path.read_bytes()) for target, path in inputs.files.items()]
    parts += [(f"link:{link}", target.encode()) for link, target in inputs.links.items()]
    return content_key(parts)


@dataclass
class GuestImage:
    key: str
    directory: Path

    @property
    def initramfs(self) -> Path:
        return self.directory / "initramfs.cpio.gz"

    @property
    def info(self) -> dict:
        return json.loads((self.directory / "build.json").read_text())

    def record(self) -> dict:
        info = self.info
        return {"key": self.key, "sha256": info["sha256"], "bytes": info["bytes"], "packages": info["packages"]}


def _package_versions(names: list[str]) -> dict[str, str | None]:
    versions = {}
    for name in names:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", name], capture_output=True, text=True, check=False
        )
        versions[name] = result.stdout.strip() if result.returncode == 0 else None
    return versions


def _stage(inputs: Inputs, links: dict[str, str], staging: Path) -> None:
    for top, target in MERGED.items():
        (staging / target).mkdir(parents=True, exist_ok=True)
        (staging / top).symlink_to(target)
    for name in ("proc", "sys", "dev", "tmp", "mnt", "root", "etc", str(GUEST_REPO / "traces")):
        (staging / name).mkdir(parents=True, exist_ok=True)  # traces/ marks /opt/ticklab as the repository
    for target, source in sorted(inputs.files.items()):
        destination = staging / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    for link, target in sorted(links.items()):
        destination = staging / link
        if destination.exists() or destination.is_symlink():
            continue  # a real file wins over a busybox applet of the same name
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.symlink_to(target)
    (staging / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (staging / "etc" / "group").write_text("root:x:0:\n")
    (staging / "etc" / "hosts").write_text("127.0.0.1 localhost ticklab-guest\n")
    for path in [*staging.rglob("*"), staging]:
        os.utime(path, (0, 0), follow_symlinks=False)


def build_image(say=print, force: bool = False) -> GuestImage:
    """The cached guest image, building it first if needed (seconds)."""
    data = recipe()
    inputs = gather(data)
    busybox = next((p for p in inputs.files.values() if p.name == "busybox"), None)
    if busybox is None:
        raise LabError(f"{RECIPE}: programs must include busybox (the guest's shell and mount)")
    links = {**busybox_links(busybox), **inputs.links}
    inputs.links = links
    key = image_key(inputs)
    final = cache_dir() / "images" / key
    if (final / "build.json").is_file() and not force:
        return GuestImage(key, final)
    if shutil.which("cpio") is None:
        raise LabError("cpio is not installed: apt-get install cpio")
    work = final.with_name(final.name + f".tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    staging = work / "root"
    staging.mkdir(parents=True)
    started = time.monotonic()
    try:
        _stage(inputs, links, staging)
        names = sorted(str(p.relative_to(staging)) for p in staging.rglob("*"))
        archive = _cpio(staging, names)
        with gzip.GzipFile(work / "initramfs.cpio.gz", "wb", compresslevel=6, mtime=0) as out:
            out.write(archive)
        shutil.rmtree(staging)
        image = work / "initramfs.cpio.gz"
        info: dict = {
            "key": key,
            "bytes": image.stat().st_size,
            "uncompressed_bytes": len(archive),
            "sha256": hashlib.sha256(image.read_bytes()).hexdigest(),
            "files": len(inputs.files),
            "links": len(links),
            "packages": _package_versions(data.get("packages", [])),
            "build_seconds": round(time.monotonic() - started, 1),
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (work / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    say(f"guest image built in {info['build_seconds']:.0f} s ({info['bytes'] / 1e6:.1f} MB): {final}")
    return GuestImage(key, final)


def _cpio(staging: Path, names: list[str]) -> bytes:
    result = subprocess.run(
        ["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0", "--reproducible"],
        input=("\n".join(names) + "\n").encode(),
        capture_output=True,
        cwd=staging,
        check=False,
    )
    if result.returncode != 0:
        raise LabError(f"cpio failed: {result.stderr.decode(errors='replace')[-300:]}")
    return result.stdout
