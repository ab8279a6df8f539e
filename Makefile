# hetfed: the two commands of the README, and a few helpers.
#   make demo      - create .venv, install, start a local deployment of 4 SuperNodes (warm ClientApp
#                    runtime), run FedRSPO+ (RSPO+ loss) on the knapsack task: 5 federated rounds and
#                    personalization, print the per-client table, stop the federation
#   make test      - create .venv if needed, lint (ruff check and format, mypy), run the fast tier
#                    (pytest -m fast, under 5 minutes on 2 cores): unit tests, quick inline runs and
#                    one real deployment smoke run (a SuperLink and 3 SuperNodes, 2 rounds)
#   make test-all  - lint, install the tools the tests need where it can (.ci/test-deps), run every
#                    test: also the federations, simulations, network namespaces, nginx, the browser
#                    and the slow runs (what CI runs, .ci/run)
#   make help      - this list
# The tiers are assigned in tests/conftest.py (markers deployment, simulation, docker, slow: the full
# tier only; smoke: the one federation of the fast tier); tests/tier_guard.py fails a fast-tier test
# that starts a federation, Docker, a network namespace or a browser.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   := .hetfed/demo

.PHONY: help install demo test test-all lint bench clean

help:
	@sed -n '2,/^$$/s/^#  \{0,2\}//p' Makefile

$(VENV)/.installed: pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	# constraints-dev.txt pins the CPU torch wheel; any other torch release downloads gigabytes.
	$(BIN)/python -m pip install --quiet -c constraints-dev.txt -e ".[dev]"
	# qpth (OptNet-style baseline) declares numpy<2: install it without its dependencies.
	$(BIN)/python -m pip install --quiet --no-deps "qpth==0.0.18"
	touch $@

install: $(VENV)/.installed

demo: install
	-@$(BIN)/hetfed federation down --dir $(DEMO) >/dev/null 2>&1
	$(BIN)/hetfed federation up --nodes 4 --dir $(DEMO)
	$(BIN)/hetfed run --engine deployment --federation-dir $(DEMO) \
	    --set strategy=fedrspo --set loss=rspo+ --set eta-o=1.0 --set num-rounds=5 --set fraction=0.5 \
	    --set local-epochs=1 --set run-name=demo-$$(date +%Y%m%d-%H%M%S); \
	  status=$$?; $(BIN)/hetfed federation down --dir $(DEMO); exit $$status

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy hetfed bench

# The fast tier on both cores (its tests mostly compute).
test: install lint
	$(BIN)/python -m pytest -m fast -n 2 --dist loadgroup

# .ci/test-deps installs the system tools the tests need (ip, nginx, chromium) where it can (root,
# apt-get) and says in one line what it could not. Real-process tests mostly wait on Flower's 3 s
# polling: four workers overlap them (make test-all WORKERS=3 to compare). loadgroup: a test goes
# to any free worker, except that the tests sharing a module-scoped fixture (a federation, a run)
# stay on one (tests/conftest.py groups them), so no whole file waits behind another on one worker.
WORKERS ?= 4
test-all: install lint
	@bash .ci/test-deps
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup

bench: install
	for b in bench/[a-z]*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .hetfed .pytest_cache .ruff_cache
