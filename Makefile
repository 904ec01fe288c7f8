# gpu-admission: `make demo` runs the product on its embedded default, `make test` runs every test.
# Both do all set-up themselves (Python packages, control-plane binaries built from Go modules; `make test` also
# helm from Go modules, the container image with buildah and the native policies' CEL evaluator; all cached
# outside the repository).
PYTHON ?= python3
export PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: setup controlplane controlplane-oldest helm image celeval lint test test-fast demo bench soak kind-e2e mutmut mutmut-fast

setup:
	$(PYTHON) -m pip install -q -e '.[test]'

controlplane:
	bash scripts/controlplane/build.sh

# The oldest Kubernetes the product supports (docs/controlplane.md, "Versions"): built and smoke-tested too.
OLDEST = K8S_VERSION=v1.33.13 ETCD_VERSION=v3.5.35
controlplane-oldest:
	$(OLDEST) bash scripts/controlplane/build.sh

# helm built from Go modules (cached), for the chart tests.
helm:
	bash scripts/helm/build.sh

# The container image, built with buildah on a Debian base made by mmdebstrap (both installed with apt-get
# when missing; cached, rebuilt when the Dockerfile or the code changes), for tests/e2e/test_image_e2e.py.
image:
	bash scripts/image/build.sh

# The CEL evaluator the native policies' unit tests run (tests/celeval: the API server's own admission code,
# its Go modules from the module proxy; cached, rebuilt when its sources change).
celeval:
	$(PYTHON) -m tests.celeval

lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

test: setup controlplane controlplane-oldest helm image celeval lint
	$(PYTHON) -m pytest -q
	$(OLDEST) $(PYTHON) -m pytest -q -m e2e tests/e2e/test_oldest_smoke.py

test-fast: setup helm celeval
	$(PYTHON) -m pytest -q -m 'not e2e'

demo: setup controlplane
	$(PYTHON) -m scripts.demo

bench: setup controlplane
	$(PYTHON) -m tests.bench.run

# 10 minutes of legitimate reviews at 500/s beside every abuse of issue #14 (not in CI): tests/soak.py
soak: setup
	$(PYTHON) -m tests.soak

kind-e2e:
	bash scripts/kind-e2e.sh

# Mutation testing of policies/ (not part of `make test`: ~1 h on 2 shared cores). Only the fast engine tests
# run per mutant ([tool.mutmut] in pyproject.toml); MUTANTS narrows it, e.g. MUTANTS='policies.rules.*'.
# Survivors are triaged in docs/testing.md.
MUTANTS ?=
mutmut:
	$(PYTHON) -m pip install -q -e '.[test,mutation]'
	HYPOTHESIS_PROFILE=mutmut $(PYTHON) -m mutmut run --max-children 2 $(MUTANTS)
	$(PYTHON) -m mutmut results

# The same mutants and tests, 3x faster (scripts/mutdrive.py): mutmut generates the mutants and collects which
# tests reach each function (the one-mutant run below), then the driver collects the tests once and forks a
# child per mutant. MUTANTS narrows it as above; a stopped run resumes from mutants/mutdrive.jsonl.
mutmut-fast:
	$(PYTHON) -m pip install -q -e '.[test,mutation]'
	HYPOTHESIS_PROFILE=mutmut $(PYTHON) -m mutmut run --max-children 2 'policies.classify.x_default_latency__mutmut_1'
	cd mutants && HYPOTHESIS_PROFILE=mutmut $(PYTHON) ../scripts/mutdrive.py $(MUTANTS)
	$(PYTHON) -m mutmut results
