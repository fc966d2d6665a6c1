# Two commands do everything on a fresh machine:
#   make reproduce   create the environment if missing, build every enabled figure at smoke scale + the report
#   make test        create the environment if missing, run the tests
#   make docs        the documentation site (Sphinx + MyST) in results/docs/html, every warning an error
#   make benchmarks  every benchmark: results/benchmarks/*.json, results/benchmarks.tsv, docs/performance.md's table
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= all

.PHONY: env lock horovod reproduce test test-fast lint format clean benchmarks docs

# Also, every time (cheap, never overwriting): the generic Slurm profile becomes your Snakemake profile `slurm`
# unless you or your site have one, so that `snakemake --profile slurm` works from the checkout. As root, Debian's
# s3fs is installed if missing (dlaas-scaling's `s3fs` data source; without it those points are skipped), and
# podman and stress-ng (biggan-profiles' container environments and their neighbour; likewise skipped without).
env: $(STAMP)
	$(BIN)/python -m ddlrepro install-profile profiles/slurm
	scripts/s3fs-tools install
	scripts/container-tools install-if-root

# Recreated only when the locked pins or the package metadata change. Every file pip takes must have a sha256 the
# lock lists (written by `make lock` from envs/requirements.txt). envs/requirements.lock holds torch's CPU build,
# found in pip's --find-links folder or PyTorch's CPU index (PIP_FIND_LINKS / PIP_INDEX_URL); on a GPU machine
# `make env LOCK=envs/requirements-cuda.lock` takes PyPI's CUDA build and its libraries instead.
LOCK ?= envs/requirements.lock
$(STAMP): $(LOCK) pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -c "import ddlrepro, snakemake, torch, pandas, matplotlib"
	touch $(STAMP)

# After editing envs/requirements.txt: resolve it again and pin every file's hash (needs PyPI; see the script).
lock: $(STAMP)
	$(BIN)/python scripts/lock-requirements

# Horovod 0.28.1 built from its sdist with envs/horovod/*.patch; the wheel is cached, rebuilt when pin/patch change.
# Where this user cannot build it (scripts/horovod's exit 3, e.g. not root and cmake, g++ or Open MPI missing), the
# Horovod points and tests are skipped, saying why, and everything else goes on.
horovod: env
	scripts/horovod install $(BIN)/python || { code=$$?; [ $$code -eq 3 ] && echo "Horovod not built: its points will be skipped"; }

# The workflow's jobs run `python` from PATH: this environment's, put first here (the workflow never edits PATH).
WITH_ENV := PATH="$(abspath $(BIN)):$$PATH"

# Horovod's compile is installation, as pip's is: done before the workflow starts (its rule is then a no-op).
reproduce: env horovod
	$(WITH_ENV) $(BIN)/snakemake --profile profiles/local --cores $(CORES)

# Two passes: the tests that judge no timing on TEST_WORKERS pytest-xdist workers, a module at a time (the Slurm
# cluster's two modules together: tests/conftest.py), then the `serial` ones (rates, speeds, deadlines, CPU hogs)
# alone. Both always run; either failing fails the target (pytest's 5, "no test selected", is no failure:
# PYTEST_ARGS may select tests of one pass only).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -ra
define two_passes
	$(PYTEST) -n $(TEST_WORKERS) --no-loadscope-reorder -m "not serial$(1)" --durations=30 $(PYTEST_ARGS); parallel=$$?; \
	$(PYTEST) -m "serial$(1)" --durations=10 $(PYTEST_ARGS); serial=$$?; \
	for code in $$parallel $$serial; do [ $$code -eq 0 ] || [ $$code -eq 5 ] || exit $$code; done
endef

test: env horovod
	scripts/browser-tools install-if-root
	$(call two_passes,)

# The documentation site: docs/*.md plus the reference pages written from the code (docs/generated/, by docs/conf.py).
docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs results/docs/html
	@echo "docs: results/docs/html/index.html"

# Before the whole suite: everything that needs no Slurm cluster, no image build, no Horovod build, and no long
# end-to-end workflow run (pytest markers, tests/conftest.py).
test-fast: env
	$(call two_passes, and not slurm and not image and not horovod and not slow)

lint: env
	$(BIN)/ruff check src tests benchmarks docs/conf.py scripts/lock-requirements
	$(BIN)/ruff format --check src tests benchmarks docs/conf.py scripts/lock-requirements
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/mypy
	$(WITH_ENV) $(BIN)/snakemake --lint
	$(BIN)/lint-imports

format: env
	$(BIN)/ruff format src tests benchmarks docs/conf.py scripts/lock-requirements
	$(BIN)/ruff check --fix src tests benchmarks docs/conf.py scripts/lock-requirements
	$(BIN)/snakefmt Snakefile workflow/rules

# KungFu's strategies whose graphs differ at a rank per host (TREE is STAR there, BINARY_TREE_STAR and AUTO are
# BINARY_TREE, MULTI_STAR is CLIQUE), on the testbed's links beside gloo's ring.
LINK_STRATEGIES := STAR BINARY_TREE CLIQUE MULTI_BINARY_TREE_STAR

benchmarks: env horovod
	$(BIN)/python benchmarks/harness_fidelity.py
	$(BIN)/python benchmarks/workflow_overhead.py
	$(BIN)/python benchmarks/monitor_overhead.py
	$(BIN)/python benchmarks/easyscale_overheads.py
	$(BIN)/python benchmarks/allreduce_strategies.py
	$(BIN)/python benchmarks/framework_fidelity.py $(if $(HOROVOD_SCRIPT),--horovod-script $(HOROVOD_SCRIPT))
	$(BIN)/python benchmarks/elastic_resize.py
	$(BIN)/python benchmarks/testbed_setup.py
	$(BIN)/python benchmarks/data_path.py
	$(BIN)/python benchmarks/link_bandwidth.py --strategies $(LINK_STRATEGIES)
	$(BIN)/python benchmarks/overlay.py
	$(BIN)/python benchmarks/adaptive_policies.py
	$(BIN)/python benchmarks/simulator_fidelity.py
	$(BIN)/python benchmarks/parameter_server.py
	$(BIN)/python benchmarks/resource_sampler.py
	$(BIN)/python benchmarks/process_exit.py
	$(BIN)/python benchmarks/process_start.py
	$(BIN)/python benchmarks/biggan_elasticity.py
	$(BIN)/python benchmarks/gan_gpu.py
	$(WITH_ENV) $(BIN)/python benchmarks/verdict_stability.py
	$(BIN)/python benchmarks/report.py
	$(BIN)/python benchmarks/readme_table.py

clean:
	rm -rf results .snakemake
