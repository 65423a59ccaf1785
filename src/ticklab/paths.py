"""Where things live: the project directory (a ticklab checkout: its notebooks, runners, kernel/ and traces/),
its bundled data, and the source documents.

The project directory is, in this order: the one ``--project DIR`` named (:func:`set_project`, which also sets
``TICKLAB_PROJECT`` so the processes ticklab starts agree), ``$TICKLAB_PROJECT``, the checkout this package runs
from (an editable or in-tree install: the package's source tree is ``<checkout>/src/ticklab``; the lab guest's
``/opt/ticklab`` is one too), the checkout ``pip install DIR`` installed it from (PEP 610's direct_url.json), and
last the project files a wheel carries (``ticklab/project/``: notebooks, runners/, kernel/, traces/published/, the
tools' sources; setup.py), so a wheel installed anywhere runs ``doctor``, ``capture`` and ``report`` on the user's own
data. Never the working directory. Without any of these, asking for one raises :class:`ProjectError` (one line
saying what to pass). Standard library only: the lab guest imports it.

What ticklab writes by default (``report``'s build/, ``capture``'s traces/<host-id>/, relative notebook outputs) goes
into :func:`work_dir`: the project itself for a checkout, and for the project a wheel carries (inside site-packages,
never written) ``$TICKLAB_HOME``, else ``~/ticklab``.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlparse

PACKAGE_DIR = Path(__file__).resolve().parent
ENV = "TICKLAB_PROJECT"
NO_PROJECT = f"no project directory: pass --project DIR or set {ENV} to a ticklab checkout"

_explicit: Path | None = None


class ProjectError(Exception):
    """No project directory, or one named that is not a ticklab checkout."""


def is_project(directory: Path) -> bool:
    """A ticklab checkout: pyproject.toml and traces/ (what the lab guest's /opt/ticklab has too)."""
    return (directory / "pyproject.toml").is_file() and (directory / "traces").is_dir()


def _checked(directory: Path | str, named_by: str) -> Path:
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise ProjectError(f"{named_by} {path}: no such directory (it must name a ticklab checkout)")
    path = path.resolve()
    if not is_project(path):
        raise ProjectError(f"{named_by} {path}: not a ticklab checkout (no pyproject.toml and traces/ there)")
    return path


def set_project(directory: Path | str | None) -> None:
    """Use ``directory`` as the project (``--project``); None forgets it. Exported as $TICKLAB_PROJECT for the
    processes ticklab starts (papermill, notebook kernels, workloads)."""
    global _explicit
    if directory is None:
        _explicit = None
        return
    _explicit = _checked(directory, "--project")
    os.environ[ENV] = str(_explicit)


def _in_tree() -> Path | None:
    """The checkout holding this package's source (src layout: two levels above the package)."""
    candidate = PACKAGE_DIR.parent.parent
    return candidate if is_project(candidate) else None


@lru_cache(maxsize=1)
def _installed_from() -> Path | None:
    """The local directory ``pip install DIR`` installed this package from, when that directory is a checkout
    (PEP 610 direct_url.json: ``dir_info``; a wheel or an index install names an archive or nothing)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        text = distribution("ticklab").read_text("direct_url.json")
        data = json.loads(text) if text else {}
    except (PackageNotFoundError, OSError, ValueError):
        return None
    url = urlparse(str(data.get("url", ""))) if isinstance(data, dict) else None
    if url is None or "dir_info" not in data or url.scheme != "file":
        return None
    directory = Path(unquote(url.path))
    return directory if is_project(directory) else None


CARRIED_PROJECT = PACKAGE_DIR / "project"  # what a wheel carries (setup.py); absent in a checkout
HOME_ENV = "TICKLAB_HOME"
CARRIED = "the project files this wheel carries"


def find_project() -> tuple[Path, str]:
    """(the project directory, what named it); ProjectError when there is none."""
    if _explicit is not None:
        return _explicit, "--project"
    if os.environ.get(ENV):
        return _checked(os.environ[ENV], ENV), ENV
    found = _in_tree()
    if found is not None:
        return found, "the checkout this package runs from"
    found = _installed_from()
    if found is not None:
        return found, "the checkout this package was installed from"
    if is_project(CARRIED_PROJECT):
        return CARRIED_PROJECT, CARRIED
    raise ProjectError(NO_PROJECT)


def work_dir() -> Path:
    """Where ticklab's default outputs go (build/, traces/<host-id>/): the project directory, but for the project a
    wheel carries, which is never written: ``$TICKLAB_HOME``, else ``~/ticklab``."""
    root, named_by = find_project()
    if named_by != CARRIED:
        return root
    return Path(os.environ.get(HOME_ENV) or Path.home() / "ticklab").expanduser()


def in_project(relative: str | Path) -> Path:
    """A relative path as ticklab resolves its defaults and notebook parameters: inside the project where it is
    there (traces/published/, the traces a checkout holds), else inside :func:`work_dir` (a wheel's build/)."""
    found = repo_root() / relative
    return found if found.exists() or work_dir() == repo_root() else work_dir() / relative


def repo_root() -> Path:
    """The project directory (see the module's docstring); ProjectError when there is none."""
    return find_project()[0]


def traces_dir() -> Path:
    return repo_root() / "traces"


def published_dir() -> Path:
    return traces_dir() / "published"


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def seeds_dir() -> Path | None:
    """The five source documents, if present: $TICKLAB_SEEDS, else ../shared/seeds beside the project."""
    env = os.environ.get("TICKLAB_SEEDS")
    candidates = [Path(env)] if env else []
    try:
        candidates.append(repo_root().parent / "shared" / "seeds")
    except ProjectError:
        pass
    for path in candidates:
        if path.is_dir():
            return path
    return None


def cache_dir() -> Path:
    """Where ticklab keeps what it builds and derives, outside the repository: $TICKLAB_CACHE, else
    ~/.cache/ticklab (lab kernels and images, host kernel builds, derived data, ``ticklab view``'s files)."""
    return Path(os.environ.get("TICKLAB_CACHE") or Path.home() / ".cache" / "ticklab")
