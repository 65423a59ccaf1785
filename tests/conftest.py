import shutil
from pathlib import Path

import pytest

from ticklab import paths

REPO = paths.repo_root()
CLAIM_IDS = ["hpet", "pvspinlock", "hrtick", "acpi-idle", "nohz"]


@pytest.fixture
def seeds():
    directory = paths.seeds_dir()
    if directory is None:
        pytest.skip("source documents not found: set TICKLAB_SEEDS or place ../shared/seeds beside the repo")
    return directory


@pytest.fixture
def published_copy(tmp_path: Path) -> Path:
    """A writable copy of traces/published to break on purpose."""
    target = tmp_path / "published"
    shutil.copytree(paths.published_dir(), target)
    return target
