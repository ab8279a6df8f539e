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
#   make docs      - build the documentation site (docs/ -> docs/_build/html) with every warning, a
#                    broken internal link included, as an error
#   make test-flower-next - the fast tier on the newest Flower pre-release, in its own venv (on demand)
#   make help      - this list
# The tiers are assigned in tests/conftest.py (markers deployment, simulation, docker, slow: the full
# tier only; smoke: the one federation of the fast tier); tests/tier_guard.py fails a fast-tier test
# that starts a federation, Docker, a network namespace or a browser.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   := .hetfed/demo

.PHONY: help install demo test test-all lint docs bench clean test-flower-next

help:
	@sed -n '2,/^$$/s/^#  \{0,2\}//p' Makefile

$(VENV)/.installed: pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	# constraints-dev.txt pins the CPU torch wheel; any other torch release downloads gigabytes.
	$(BIN)/python -m pip install --quiet -c constraints-dev.txt -e ".[dev,docs]"
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

# -W: a warning is an error; -n: so is a reference that does not resolve; MyST warns for every link
# to a page, heading or repository file that does not exist (docs/contributing.md).
docs: install
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html

# make test-flower-next: the fast tier on the newest Flower pre-release in the registry, in a venv of
# its own (on demand, never in CI: a moving pre-release must not decide what lands; docs/runtime.md
# records the last result). flwr-nightly is another distribution of the same `flwr` package, so it
# goes in first, then hetfed's other requirements without flwr, then hetfed itself with --no-deps:
# nothing puts Flower's release back over the nightly. FAST_TESTS: the fast tier's pytest arguments.
FAST_TESTS  ?= -m fast
FLOWER_NEXT ?= .venv-flower-next

$(FLOWER_NEXT)/.installed: pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(FLOWER_NEXT)
	grep -v '^flwr' constraints-dev.txt > $(FLOWER_NEXT)/constraints.txt
	# A pre-release in the specifier admits pre-releases of flwr-nightly only (not of its dependencies).
	$(FLOWER_NEXT)/bin/python -m pip install --quiet -c $(FLOWER_NEXT)/constraints.txt \
	    "flwr-nightly[simulation]>=1.42.0.dev0,<2"
	$(FLOWER_NEXT)/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	    print("\n".join(r for r in p["dependencies"] + p["optional-dependencies"]["dev"] \
	    if not r.startswith("flwr")))' > $(FLOWER_NEXT)/requirements.txt
	$(FLOWER_NEXT)/bin/python -m pip install --quiet -c $(FLOWER_NEXT)/constraints.txt \
	    -r $(FLOWER_NEXT)/requirements.txt
	$(FLOWER_NEXT)/bin/python -m pip install --quiet --no-deps -e . "qpth==0.0.18"
	! $(FLOWER_NEXT)/bin/python -m pip show --quiet flwr 2>/dev/null  # only the nightly provides flwr
	touch $@

test-flower-next: $(FLOWER_NEXT)/.installed
	$(FLOWER_NEXT)/bin/python -m pip list 2>/dev/null | grep -i '^flwr'
	$(FLOWER_NEXT)/bin/python -m hetfed.cli runtime check
	$(FLOWER_NEXT)/bin/python -m pytest $(FAST_TESTS)

bench: install
	for b in bench/[a-z]*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(FLOWER_NEXT) .hetfed .pytest_cache .ruff_cache docs/_build
