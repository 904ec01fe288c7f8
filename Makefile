# gpu-admission: `make demo` runs the product on its embedded default, `make test` runs every test.
# Both do all set-up themselves (Python packages, control-plane binaries built from Go modules, cached).
PYTHON ?= python3
export PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: setup controlplane helm lint test test-fast demo bench kind-e2e

setup:
	$(PYTHON) -m pip install -q -e '.[test]'

controlplane:
	bash scripts/controlplane/build.sh

# helm built from Go modules (cached), for the chart tests.
helm:
	bash scripts/helm/build.sh

lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

test: setup controlplane helm lint
	$(PYTHON) -m pytest -q

test-fast: setup helm
	$(PYTHON) -m pytest -q -m 'not e2e'

demo: setup controlplane
	$(PYTHON) -m scripts.demo

bench: setup controlplane
	$(PYTHON) -m tests.bench.run

kind-e2e:
	bash scripts/kind-e2e.sh
