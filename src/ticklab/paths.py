"""Where things live: the repository, its bundled data, and the source documents."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The checkout this package is installed from (src layout: two levels above the package)."""
    candidate = PACKAGE_DIR.parent.parent
    if (candidate / "pyproject.toml").is_file() and (candidate / "traces").is_dir():
        return candidate
    # An installed (non-editable) package: fall back to the working directory.
    return Path.cwd()


def traces_dir() -> Path:
    return repo_root() / "traces"


def published_dir() -> Path:
    return traces_dir() / "published"


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def seeds_dir() -> Path | None:
    """The five source documents, if present: $TICKLAB_SEEDS, else ../shared/seeds beside the repo."""
    env = os.environ.get("TICKLAB_SEEDS")
    candidates = [Path(env)] if env else []
    candidates.append(repo_root().parent / "shared" / "seeds")
    for path in candidates:
        if path.is_dir():
            return path
    return None
