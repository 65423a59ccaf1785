"""The pip lock and the conda environment pin the same versions; the packaging metadata is sane."""

import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import yaml

from conftest import REPO


def _name(text: str) -> str:
    """A package name as PEP 503 compares them: conda-forge spells jupyter_client, pip's lock jupyter-client."""
    return re.sub(r"[-_.]+", "-", text).lower()


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_name(name)] = version
    return pins


def _conda_pins() -> dict[str, str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pins = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str) and "=" in dep and not dep.startswith("python"):
            name, version = dep.split("=", 1)
            pins[_name(name)] = version
    return pins


def test_environment_yml_pins_the_lock_versions():
    lock, conda = _lock(), _conda_pins()
    assert conda, "environment.yml pins nothing"
    drift = {name: (version, lock.get(name)) for name, version in conda.items() if lock.get(name) != version}
    assert drift == {}, f"environment.yml vs requirements.lock: {drift}"


def test_every_direct_dependency_is_locked_and_in_conda():
    direct = []
    for line in (REPO / "requirements.in").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            direct.append(_name(re.split(r"[<>=!~ ]", line)[0]))
    lock, conda = _lock(), _conda_pins()
    assert [d for d in direct if d not in lock] == []
    assert [d for d in direct if d not in conda] == []


def test_pyproject_declares_package_script_and_python():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "ticklab"
    assert meta["project"]["requires-python"] == ">=3.11"  # ipykernel 7.4 needs 3.11
    assert meta["project"]["scripts"]["ticklab"] == "ticklab.cli:main"


def test_citation_cff_is_version_1_2_0_with_required_keys():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors"):
        assert cff[key], key


def test_ci_script_runs_make_test():
    assert "make test" in (REPO / ".ci" / "run").read_text()
