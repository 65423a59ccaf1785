"""Issue 40, item 3: every YAML file ticklab reads goes through one loader (ticklab.yamlsafe), found wanting by a
fuzzing campaign (its facts 7 and 11):

7  an alias bomb: a 2.6 KB experiment took 40 s and 350 MB before it was refused (its error message was built from
   str() of the fully expanded value, 52 MB, before it was shortened; each nesting level multiplied the cost by
   ten); the same through a published provenance.yaml. Anchors and aliases are now refused while the document is
   composed, before anything is built, and error lines quote a bounded preview, never str() of a whole value;
11 empty typed scalars (``!!int ''``, ``!!float ''``): "unexpected IndexError … a ticklab bug" from an experiment,
   "IndexError: string index out of range" from provenance.yaml. Now one line with the key's path.
"""

import re
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from ticklab.analysis.published import PublishedDataError, load_published
from ticklab.capture.experiment import ExperimentError, load_experiment
from ticklab.cli import main

TBENCH = REPO / "runners/acpi-idle/tbench.yaml"


def alias_bomb(levels: int, key: str = "runs") -> str:
    """``levels`` nested lists of ten aliases of the level below, the last one as ``key``'s value: 10**levels
    strings once expanded, from a few hundred bytes."""
    lines = ['b0: &b0 "' + "x" * 50 + '"']
    for level in range(1, levels + 1):
        lines.append(f"b{level}: &b{level} [{', '.join([f'*b{level - 1}'] * 10)}]")
    return "\n".join(lines) + f"\n{key}: *b{levels}\n"


def with_lines(path: Path, text: str, tmp_path: Path) -> Path:
    """A copy of the experiment at ``path`` with ``text`` appended (a later key wins)."""
    target = tmp_path / path.name
    target.write_text(path.read_text() + "\n" + text)
    return target


# -- fact 7: alias bombs ----------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_an_alias_bomb_experiment_is_refused_at_once_before_anything_is_built(tmp_path):
    path = with_lines(TBENCH, alias_bomb(8), tmp_path)
    assert path.stat().st_size < 4000
    started = time.monotonic()
    with pytest.raises(ExperimentError) as raised:
        load_experiment(path)
    assert time.monotonic() - started < 2
    line = str(raised.value)
    assert line == (
        f"{path}: line {TBENCH.read_text().count(chr(10)) + 2}: anchor &b0: YAML anchors and aliases are "
        "not accepted (write the value out where it is used)"
    )


@pytest.mark.timeout(120)
def test_an_alias_bomb_through_the_cli_is_one_line(tmp_path, capsys):
    path = with_lines(TBENCH, alias_bomb(8), tmp_path)
    assert main(["capture", "acpi-idle", "--experiment", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "anchors and aliases are not accepted" in err and len(err.splitlines()) == 1 and len(err) < 400


def test_a_single_alias_is_refused_too(tmp_path):
    path = with_lines(TBENCH, "x: &seed 7\nseed: *seed\n", tmp_path)
    with pytest.raises(
        ExperimentError,
        match=r"tbench.yaml: line \d+: anchor &seed: YAML anchors and aliases are not "
        r"accepted",
    ):
        load_experiment(path)


@pytest.mark.timeout(120)
def test_an_alias_bomb_in_a_published_provenance_is_refused_at_once(published_copy):
    provenance = published_copy / "hrtick" / "provenance.yaml"
    provenance.write_text(provenance.read_text() + "\n" + alias_bomb(8, key="not_transcribed"))
    started = time.monotonic()
    with pytest.raises(
        PublishedDataError,
        match=rf"^{provenance}: line \d+: anchor &b0: YAML anchors and aliases are "
        r"not accepted \(write the value out where it is used\)$",
    ):
        load_published(published_copy, "hrtick")
    assert time.monotonic() - started < 2


def test_an_error_line_quotes_a_bounded_preview_never_the_whole_value():
    """What an alias bomb's value was, built without aliases: a preview of it is built from the pieces it shows."""
    from ticklab import yamlsafe

    level = "x" * 50
    for _ in range(12):  # 10**12 strings, shared: repr() or str() of it would never end
        level = [level] * 10
    started = time.monotonic()
    text = yamlsafe.preview(level)
    assert time.monotonic() - started < 1 and len(text) <= 80 + 30 and text.startswith("[[[")
    assert yamlsafe.preview(10**5000) == "an integer of about 5001 digits"
    assert yamlsafe.preview("a\nb\x1b") == r"'a\nb\x1b'"  # repr's escapes: no control character in the line


# -- fact 11: empty typed scalars -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, message",
    [
        ("runs: !!int ''", "runs: empty !!int value"),
        ("timeout_s: !!float ''", "timeout_s: empty !!float value"),
        ("workload: {tool: tbench, argv: [tbench, !!int '']}", "workload.argv[1]: empty !!int value"),
        ("seed: !!bool ''", "seed: empty !!bool value"),
        ("notes: !!timestamp '  '", "notes: empty !!timestamp value"),
        ("runs: !!int ' '", "runs: empty !!int value"),
    ],
)
def test_an_empty_typed_value_in_an_experiment_is_refused_with_its_key(tmp_path, line, message):
    path = with_lines(TBENCH, line + "\n", tmp_path)
    with pytest.raises(ExperimentError) as raised:
        load_experiment(path)
    assert re.fullmatch(rf"{re.escape(str(path))}: line \d+: {re.escape(message)}", str(raised.value))


def test_an_empty_typed_value_through_the_cli_is_not_a_ticklab_bug(tmp_path, capsys):
    path = with_lines(TBENCH, "runs: !!int ''\n", tmp_path)
    status = main(["capture", "acpi-idle", "--experiment", str(path), "--dry-run"])
    err = capsys.readouterr().err
    assert status == 2 and "runs: empty !!int value" in err and "IndexError" not in err and "bug" not in err


@pytest.mark.parametrize(
    "line, message",
    [
        ("not_transcribed: [!!int '']", "not_transcribed[0]: empty !!int value"),
        ("extra: {year: !!float ''}", "extra.year: empty !!float value"),
    ],
)
def test_an_empty_typed_value_in_a_provenance_is_refused_with_its_key(published_copy, line, message):
    provenance = published_copy / "hrtick" / "provenance.yaml"
    provenance.write_text(provenance.read_text() + "\n" + line + "\n")
    with pytest.raises(PublishedDataError) as raised:
        load_published(published_copy, "hrtick")
    assert re.fullmatch(rf"{re.escape(str(provenance))}: line \d+: {re.escape(message)}", str(raised.value))


def test_a_typed_value_pyyaml_cannot_build_names_its_key(tmp_path):
    path = with_lines(TBENCH, "notes: !!timestamp 2026-13-45\n", tmp_path)
    with pytest.raises(
        ExperimentError,
        match=r"tbench.yaml: line \d+: notes: !!timestamp value '2026-13-45' cannot be read "
        r"\(month must be in 1..12\)$",
    ):
        load_experiment(path)


# -- one loader --------------------------------------------------------------------------------------------------
def test_the_shared_loader_reads_every_yaml_file_of_the_repository_as_safe_load_does():
    from ticklab import yamlsafe

    files = [
        *REPO.glob("runners/**/*.yaml"),
        *REPO.glob("traces/published/*/provenance.yaml"),
        *REPO.glob("kernel/**/*.yaml"),
    ]
    assert len(files) > 20
    for path in files:
        assert yamlsafe.load(path.read_text()) == yaml.safe_load(path.read_text()), path


def test_the_lab_loaders_use_it(tmp_path, monkeypatch):
    from ticklab.lab import labhost, sources
    from ticklab.lab.cache import LabError

    bad = tmp_path / "sources.yaml"
    bad.write_text("mirror: &m https://deb.debian.org/debian\nsources: {6.12: {package: *m}}\n")
    with pytest.raises(LabError, match=r"sources.yaml: cannot be read \(line 1: anchor &m: YAML anchors and aliases"):
        sources._load(bad, 0.0)
    root = tmp_path / "repo"
    (root / labhost.RECIPE).parent.mkdir(parents=True)
    (root / labhost.RECIPE).write_text("suite: !!int ''\n")
    monkeypatch.setattr(labhost, "repo_root", lambda: root)
    with pytest.raises(LabError, match=r"cannot read the lab host recipe \(line 1: suite: empty !!int value\)"):
        labhost.recipe()


def test_nothing_in_ticklab_calls_yaml_safe_load_but_the_shared_loader():
    calls = {
        str(p.relative_to(REPO)) for p in (REPO / "src/ticklab").rglob("*.py") if "yaml.safe_load(" in p.read_text()
    }
    # boot_capture compares the plan's own copy of an experiment (already loaded through the shared loader);
    # lab/image.py reads the repository's guest image recipe
    assert calls <= {"src/ticklab/capture/boot_capture.py", "src/ticklab/lab/image.py"}


def test_merge_keys_without_aliases_still_load():
    from ticklab import yamlsafe

    assert yamlsafe.load("<<: {a: 1}\nb: 2\n") == {"a": 1, "b": 2}
    assert yamlsafe.load("") is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: [", "not valid YAML ("),
        ("[" * 5000, "nested too deeply"),
        ("a: 1\n---\nb: 2\n", "expected a single document"),
        ("x: !!python/object/apply:os.system ['true']", "could not determine a constructor"),
    ],
)
def test_other_bad_yaml_is_one_line(text, message):
    from ticklab import yamlsafe

    with pytest.raises(yamlsafe.YamlError) as raised:
        yamlsafe.load(text)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_bundled_published_data_still_loads():
    for claim in ("acpi-idle", "hpet", "hrtick", "nohz", "pvspinlock"):
        assert load_published(REPO / "traces" / "published", claim).tables


# -- issue 55 item 8: a control character was an internal error ------------------------------------------------
@pytest.mark.parametrize("character", ["\x01", "\x1b", "\x7f", "\ufffe"])
def test_a_control_character_in_an_experiment_is_one_line_with_the_file_and_line(tmp_path, capsys, character):
    lines = TBENCH.read_text().splitlines()
    path = with_lines(TBENCH, f"notes: a{character}b\n", tmp_path)
    with pytest.raises(ExperimentError) as raised:
        load_experiment(path)
    assert str(raised.value).startswith(f"{path}: line {len(lines) + 2}: character #x") and "\n" not in str(
        raised.value
    )
    status = main(["capture", "acpi-idle", "--experiment", str(path), "--dry-run"])
    err = capsys.readouterr().err
    assert status == 2 and f"{path}: line {len(lines) + 2}: " in err and "bug" not in err and "ReaderError" not in err


def test_verify_published_names_a_bad_provenance_and_goes_on_to_the_rest(published_copy, capsys):
    provenance = published_copy / "hrtick" / "provenance.yaml"
    provenance.write_text(provenance.read_text() + "\nnotes: x\x01y\n")
    status = main(["verify-published", "--published-dir", str(published_copy), "--seeds", str(published_copy)])
    out = capsys.readouterr().out
    hrtick = [line for line in out.splitlines() if line.startswith("hrtick: ")]
    assert status == 1 and len(hrtick) == 1 and f"{provenance}: line " in hrtick[0] and "not allowed" in hrtick[0]
    others = {line.split(":", 1)[0] for line in out.splitlines()} - {"hrtick"}
    assert {"hpet", "pvspinlock", "acpi-idle", "nohz"} <= others  # each of the other claims still checked
