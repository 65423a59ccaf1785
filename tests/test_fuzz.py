"""Property tests over every loader family (issue 14, deliverable 6): hypothesis draws the mutation of a seed
input (benchmarks/fuzzcases.py, the same cases `make fuzz` runs 10,000 of) and the loader must answer with a
clear ticklab error or a correct result — never a traceback, never a known-bad input accepted.

Bounded: derandomized, a few dozen examples per family, no deadline (a noisy 2-core VM must not fail them)."""

import atexit
import functools
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from fuzzcases import (
    BundleFamily,
    CliYamlFamily,
    DrawSource,
    PublishedFamily,
    TraceFamily,
    WorkloadFamily,
)

BOUNDED = settings(
    derandomize=True,
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

_SEEDS = Path(tempfile.mkdtemp(prefix="ticklab-fuzz-seeds-"))
_WORK = Path(tempfile.mkdtemp(prefix="ticklab-fuzz-work-"))
atexit.register(shutil.rmtree, _SEEDS, ignore_errors=True)
atexit.register(shutil.rmtree, _WORK, ignore_errors=True)


@functools.cache
def _prepared(kind):
    family = kind()
    family.prepare(_SEEDS)
    return family


def _holds(kind, data):
    family = _prepared(kind)
    outcome = family.case(DrawSource(data), _WORK / family.key)
    assert outcome.kind in ("error", "accepted"), f"{outcome.kind}: {outcome.detail}"


@BOUNDED
@given(st.data())
def test_bundles_never_traceback_and_never_accept_a_tampered_bundle(data):
    (_WORK / "bundle").mkdir(parents=True, exist_ok=True)
    _holds(BundleFamily, data)


@BOUNDED
@given(st.data())
def test_workload_parsers_refuse_bad_output_with_the_file_named(data):
    (_WORK / "workload").mkdir(parents=True, exist_ok=True)
    _holds(WorkloadFamily, data)


@pytest.mark.slow
@BOUNDED
@given(st.data())
def test_the_published_loader_never_tracebacks_or_reads_outside(data):
    (_WORK / "published").mkdir(parents=True, exist_ok=True)
    _holds(PublishedFamily, data)


@BOUNDED
@given(st.data())
def test_cli_arguments_and_experiment_yaml_are_refused_in_one_line(data):
    (_WORK / "cli").mkdir(parents=True, exist_ok=True)
    _holds(CliYamlFamily, data)


@BOUNDED
@given(st.data())
def test_trace_files_through_the_public_read_api(data):
    (_WORK / "trace").mkdir(parents=True, exist_ok=True)
    _holds(TraceFamily, data)


def _other_families():
    from fuzzcases_all import FAMILIES

    named = (BundleFamily, CliYamlFamily, PublishedFamily, TraceFamily, WorkloadFamily)
    return [type(f) for f in FAMILIES if not isinstance(f, named)]


# the families whose campaign takes over a second of CPU: make test runs them, make check leaves them out
SLOW_FAMILIES = {"bombs", "trace-counts", "plan-state", "output-places", "journals", "fork-frames", "kernel-root"}


@pytest.mark.parametrize(
    "kind",
    [pytest.param(kind, marks=pytest.mark.slow) if kind.key in SLOW_FAMILIES else kind for kind in _other_families()],
    ids=lambda kind: kind.key,
)
def test_every_other_family_answers_clearly(kind):
    """The families issue 27 added (special files, plan state, command-line words, out-directory links, trace
    counts ...): the same property, a few dozen drawn inputs each."""

    @BOUNDED
    @given(st.data())
    def holds(data):
        (_WORK / kind.key).mkdir(parents=True, exist_ok=True)
        _holds(kind, data)

    holds()


@BOUNDED
@given(st.data())
def test_kernel_command_line_words_never_reach_grub_as_extra_lines(data):
    from fuzzcases_plans import CmdlineWordsFamily

    (_WORK / "cmdline-words").mkdir(parents=True, exist_ok=True)
    _holds(CmdlineWordsFamily, data)
