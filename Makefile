# ticklab — the two commands a fresh machine needs:  make reproduce   and   make test
# Both create .venv from requirements.lock when it is missing or older than the lock.

PYTHON ?= python3
VENV   ?= .venv
OUT    ?= build
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ticklab-installed
# the installer of the lock (not a dependency of ticklab: it only installs requirements.lock faster than pip)
UV_VERSION := 0.13.8
# Python's bytecode (and pytest's rewritten tests) kept in ~/.cache/ticklab/pycache, never in the tree, and kept even
# where PYTHONDONTWRITEBYTECODE is set (a sandbox's default): compiled anew each time, the sources and the tests cost
# every make check worker 6 s before its first test, and every report's fork server 1 s.
# Only in a directory no other user can write (issue 55 item 3): where root keeps another user's HOME (sudo -E, sudoers
# env_keep) a .pyc that user planted there would run as root. The prefix (HOME's, or one set in the environment) is
# used when every directory of its real path that exists belongs to root or the user running make and is writable by
# no one else unless sticky (as /tmp is); else none, and no bytecode written.
PYCACHE_WANTED := $(if $(filter environment,$(origin PYTHONPYCACHEPREFIX)),$(PYTHONPYCACHEPREFIX),$(HOME)/.cache/ticklab/pycache)
PYCACHE_SAFE := $(shell sh $(dir $(abspath $(firstword $(MAKEFILE_LIST))))tools/safe-pycache-prefix '$(subst ','\'',$(PYCACHE_WANTED))')
ifneq ($(PYCACHE_SAFE),)
export PYTHONPYCACHEPREFIX := $(PYCACHE_SAFE)
export PYTHONDONTWRITEBYTECODE :=
else
unexport PYTHONPYCACHEPREFIX
export PYTHONDONTWRITEBYTECODE := 1
endif

.PHONY: help reproduce test check lint env lock clean tools capture doctor bench fuzz verdict-characteristics pooled-characteristics lab lab-kernels lab-host lab-host-bundles lab-host-test \
        lab-host-nohz-kexec lab-host-nohz-grub lab-host-hpet lab-host-nohz-hz lab-host-hrtick \
        jupyter kernelspec

help:  ## list the targets
	@echo "ticklab make targets (README.md says more):"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 24
	@echo "The ticklab command is .venv/bin/ticklab; put it on PATH with: export PATH=\"$(CURDIR)/.venv/bin:\$$PATH\""

reproduce: $(STAMP)  ## create .venv if needed, run every notebook on the bundled data, write build/
	$(BIN)/ticklab report --out $(OUT)
	@echo "The ticklab command is $(BIN)/ticklab ('make help' says how to put it on PATH)."

# Two workers (pytest-xdist): tests/conftest.py puts the tests that change this machine in one group and the guest
# boots in another, each run one test at a time on one worker, the longest groups first; TEST_WORKERS=0 runs
# everything in this process.
TEST_WORKERS ?= 2
test: $(STAMP) tools  ## the whole test suite (what CI runs)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --no-loadscope-reorder </dev/null

# make check: the same workers and groups, without the tests marked slow (tests/test_make_check.py keeps it so).
check: $(STAMP) tools lint  ## the fast lane for the edit-test loop: make lint, then every test not marked slow (2 workers; its time: README.md)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --no-loadscope-reorder -m "not slow" --durations=5 </dev/null

lint: $(STAMP)  ## ruff (the linter, the formatter's check) and mypy within its per-module baseline (tools/typecheck.py)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/typecheck.py

# Our C measurement programs (tools/bin/ftq, tools/bin/clockbench).
tools:  ## build our C measurement programs (tools/bin)
	$(MAKE) -C tools

# What this host can run, then every claim's host experiments (root; minutes). CLAIMS=... to choose
# (default: every claim with a host experiment, from 'ticklab claims --host').
CLAIMS ?= $(shell $(BIN)/ticklab claims --host 2>/dev/null)
doctor: $(STAMP) tools  ## what this host can run for each claim, and why not
	$(BIN)/ticklab doctor

capture: $(STAMP) tools  ## every claim's host experiments (root; minutes; CLAIMS=... to choose)
	@for claim in $(CLAIMS); do $(BIN)/ticklab capture $$claim || exit $$?; done

# The guest lab (root; a kernel build takes about 6 minutes on 2 cores, each guest boot a few seconds under
# TCG): lab kernels from linux-source-6.12 + kernel/patches, the guest image, then every claim's lab
# experiments in QEMU guests. LAB_CLAIMS=... to choose, LAB_ARGS="--runs 8" to pass options to 'lab run'.
LAB_VARIANTS ?= hz1000 hz250
LAB_CLAIMS ?= $(shell $(BIN)/ticklab claims --lab 2>/dev/null)
LAB_ARGS ?=
lab-kernels: $(STAMP) tools  ## build the lab kernels and guest image (root; 6-18 min a kernel)
	$(BIN)/ticklab lab build-kernel --variant $(LAB_VARIANTS)
	$(BIN)/ticklab lab build-image

lab: lab-kernels  ## every claim's lab experiments in QEMU guests (root; long)
	@for claim in $(LAB_CLAIMS); do $(BIN)/ticklab lab run $$claim $(LAB_ARGS) || exit $$?; done

# The lab host (issue 28): a Debian 12 disk image booted by BIOS, grub and systemd, where boot plans run as on a
# user's machine (root; about 10 min to build, cached by content hash). lab-host-bundles: the lab host's five plans
# whose bundles are committed, a target each below; lab-host-test: the plans' end-to-end tests (abort, a refused boot,
# a missing kernel image, a stop and resume; about an hour and a half of TCG boots).
# Sized to decide (issue 53): each plan makes its experiment's own runs (runs: 10 a condition) with its stopping rule
# across boots, no --runs override. Each comment gives the family's m (the distinct tests the claim makes on the
# plan's conditions on the lab host, whose CIs are Bonferroni's at 1 - 0.05/m) and the fewest runs a condition whose
# exact rank CI is bounded at that level (tests/test_labhost_runs.py holds the count to it, from the verdict path).
# Times: the boots at the minutes a run took in the committed 3-run plans (2 vCPUs, TCG, 2026-11-27/28), plus about
# 10 min to copy the image, install the checkout and boot to start and to check; a kernel build, once, 6-21 min.
# --warmup 0: every run is a boot of its own, so a warm-up run warms nothing a measured run keeps.
# A plan stopped part way (Ctrl-C, SIGTERM, this machine going down) keeps its disk, and its target goes on with it:
# e.g. make lab-host-hrtick LAB_HOST_ARGS=--resume (the one-line message on the stop gives the command itself).
LAB_HOST_ARGS ?=
# a series of kernel/sources.yaml (Debian's linux-source-X.Y, installed or fetched) or a tarball's path
KERNEL_612 ?= 6.12
KERNEL_72 ?= 7.2
lab-host: $(STAMP) tools  ## build the lab host disk image (root; debootstrap, ~10 min)
	$(BIN)/ticklab lab build-host

lab-host-bundles: lab-host-nohz-kexec lab-host-nohz-grub lab-host-hpet lab-host-nohz-hz lab-host-hrtick  ## the lab host's boot plans (nohz kexec/grub/HZ, hpet on the patched 6.12, hrtick on 6.12 and 7.2), 10 runs a condition, bundles into traces/ (root; about 8 h)

# nohz, tick on vs nohz_full at this kernel's HZ (host-boot-ftq), by kexec: m = 1, an exact 95% CI is bounded from
# 4 runs a condition; 10 runs a condition, 20 boots at 2.7 min: about 1.1 h.
lab-host-nohz-kexec: lab-host
	$(BIN)/ticklab lab host-plan nohz --boot kexec --warmup 0 --out traces $(LAB_HOST_ARGS)

# the same plan by firmware and grub's one-shot entry: m = 1, bounded from 4 runs a condition; 10 runs a condition,
# 20 boots at 3.2 min: about 1.2 h.
lab-host-nohz-grub: lab-host
	$(BIN)/ticklab lab host-plan nohz --boot grub --warmup 0 --out traces $(LAB_HOST_ARGS)

# hpet on the patched 6.12 (host-boot-clock-read): m = 1 (read sharing on vs off needs vCPUs that run at once, which
# the lab host's single TCG thread has not: not testable here, out of the family; HPET without sharing vs TSC is
# tested), bounded from 4 runs a condition; 10 runs a condition, 30 boots at 1.9 min and 9 s more for its 10 s runs:
# about 1.2 h.
lab-host-hpet: lab-host
	$(BIN)/ticklab lab host-plan hpet --boot kexec --warmup 0 --out traces \
	  --experiment runners/hpet/host-boot-clock-read.yaml --kernel $(KERNEL_612) $(LAB_HOST_ARGS)

# nohz at HZ=250 vs HZ=1000 (host-boot-hz; two 6.12 builds): m = 2 (FTQ work per quantum, time in the timer
# interrupt), bounded from 5 runs a condition; 10 runs a condition, 20 boots at 2.7 min: about 1.1 h.
lab-host-nohz-hz: lab-host
	$(BIN)/ticklab lab host-plan nohz --boot kexec --warmup 0 --out traces \
	  --experiment runners/nohz/host-boot-hz.yaml --kernel $(KERNEL_612) --kernel-fragment $(KERNEL_612) kernel/fragments/hz1000.config $(LAB_HOST_ARGS)

# hrtick on 6.12 and 7.2, HRTICK on and off (host-boot-kernels): m = 5 (runtime on 6.12 and on 7.2; the HRTICK timer's
# reprograms per second, per 1000 messages, and the share of its starts that reprogram), and the spurious interrupt
# ratio's level row (a 95% CI of 7.2 HRTICK-on's median), bounded from 6 runs a condition; 10 runs a condition, 40 boots at 4.4 min: about 3.1 h. Its stopping rule's budget (3600 s of runs, up to
# 30 a condition) is spent by those boots under TCG, so it stops at 10 and says so; LAB_HOST_ARGS="--budget-s 21600"
# lets it add rounds.
lab-host-hrtick: lab-host
	$(BIN)/ticklab lab host-plan hrtick --boot kexec --warmup 0 --out traces \
	  --experiment runners/hrtick/host-boot-kernels.yaml --kernel $(KERNEL_612) --kernel $(KERNEL_72) $(LAB_HOST_ARGS)

lab-host-test: lab-host  ## the lab host's end-to-end plan tests (root; about an hour and a half)
	TICKLAB_LAB_HOST_TESTS=1 $(BIN)/python -m pytest -q -n 1 -m labhost tests/test_labhost.py </dev/null

# JupyterLab on the repository with the environment registered as the "ticklab" kernel, the kernelspec every notebook
# declares (name ticklab, display name "Python (ticklab)"). papermill --engine ticklab and ticklab report need none
# installed: where it is missing the engine runs the notebooks in the interpreter papermill runs in.
JUPYTER_PORT ?= 8888
kernelspec: $(STAMP)  ## register .venv as the "Python (ticklab)" Jupyter kernel the notebooks declare
	$(BIN)/python -m ipykernel install --sys-prefix --name ticklab --display-name "Python (ticklab)"

jupyter: kernelspec  ## JupyterLab on the repository with the ticklab kernel
	$(BIN)/jupyter lab --no-browser --port $(JUPYTER_PORT) --ServerApp.root_dir=$(CURDIR) $(if $(filter 0,$(shell id -u)),--allow-root)

# Ingest speed and memory against 'trace-cmd report' (root: records up to 1M events first, as many as the host gives;
# a few minutes).
# BENCH_ARGS="--runs 7" or "--keep DIR" or trace files to use instead of the recorded ones.
BENCH_ARGS ?=
bench: $(STAMP) tools  ## ingest speed against trace-cmd report (root)
	$(BIN)/python benchmarks/ingest_speed.py $(BENCH_ARGS)

# The fault and bad-input campaign (issue 14): >= 10,000 generated inputs per loader family, each with a
# deadline; prints the table of clear errors, tracebacks, hangs and silently accepted inputs (minutes).
# FUZZ_ARGS="--inputs 500 --family bundle" for a short one; --replay FAMILY:INDEX shows one input's traceback.
FUZZ_ARGS ?=
fuzz: $(STAMP)  ## the bad-input campaign: >= 10,000 generated inputs per loader family (minutes)
	$(BIN)/python benchmarks/fuzz.py $(FUZZ_ARGS)

# The operating characteristics of the verdict words (issue 31): P(word | truth) of the verdict path on synthetic
# runs of known truth (4 comparisons' real targets × 6 truths × CV 2/10/50% × 3/5/10/20 runs × with and without
# drift), each replicate judged by the verdict path without and with its blocks, with the issue's acceptance checks;
# writes bench-out/verdict-characteristics/ (about an hour at 400 replicates a cell on the 2-core reference machine:
# 21 min without blocks, 39 with). VC_ARGS="--quick" for 40 replicates, "--family 3", "--analysis blocks", "--out DIR".
VC_ARGS ?=
verdict-characteristics: $(STAMP)  ## P(word | truth) of the verdict words on synthetic runs (issue 31; about an hour)
	$(BIN)/python benchmarks/verdict_characteristics.py $(VC_ARGS)

# writes bench-out/pooled-characteristics/: P(pooled word | truth) on synthetic fleets (issue 57). PC_ARGS="--quick" for
# 20 fleets a cell, "--comparison", "--machines", "--spread", "--runs", "--truth" for part of the grid, "--out DIR".
PC_ARGS ?=
pooled-characteristics: $(STAMP)  ## P(word | truth) of the pooled word on synthetic fleets of known truth (issue 57)
	$(BIN)/python benchmarks/pooled_characteristics.py $(PC_ARGS)

env: $(STAMP)  ## create or update .venv from requirements.lock

$(STAMP): requirements.lock pyproject.toml setup.py src/ticklab/trace/_ringbuf.c
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "ticklab needs Python >= 3.11 (ipykernel 7.4 does); set PYTHON=/path/to/python3.11+")'
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { echo "'$(PYTHON) -m venv' is unavailable: install python3-venv (Debian/Ubuntu: apt-get install python3-venv)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# uv installs the lock's pins in parallel, bytecode compiled as pip does: 30 s where pip took 62 s on 2 cores
	@# (2026-11-28, the same pins either way); pip alone where uv cannot be had
	@# the venv's bytecode in the venv: PYTHONPYCACHEPREFIX (above) would divert --compile-bytecode into the prefix,
	@# leaving .venv/bin/ticklab, run outside make, to compile every module on each start where bytecode is not written
	if $(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION); then \
	  env -u PYTHONPYCACHEPREFIX $(BIN)/python -m uv pip install --quiet --python $(BIN)/python --compile-bytecode -r requirements.lock; \
	else env -u PYTHONPYCACHEPREFIX $(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock; fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

# Re-resolve requirements.in into requirements.lock for the oldest supported Python (3.11: ipykernel 7.4 needs it), in a scratch
# directory of its own (build/ is the report's: ticklab report refuses a directory it did not make).
lock: $(STAMP)
	@scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT && \
	$(BIN)/python -m pip install --quiet --dry-run --ignore-installed --python-version 3.11 \
	    --only-binary=:all: --target $$scratch/target --report $$scratch/report.json -r requirements.in && \
	$(BIN)/python -m ticklab.lockfile $$scratch/report.json requirements.lock

clean:  ## remove build/ and the built tools
	rm -rf $(OUT)
	$(MAKE) -C tools clean
