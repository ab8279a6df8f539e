# hetfed: the two commands of the README, and a few helpers.
#   make demo  - create .venv, install, start a local deployment of 4 SuperNodes (warm ClientApp
#                runtime), run FedRSPO+ (RSPO+ loss) on the knapsack task: 5 federated rounds and
#                personalization, print the per-client table, stop the federation
#   make test  - create .venv if needed, lint (ruff check and format, mypy), install the tools the
#                tests need where it can (.ci/test-deps), run the test suite
#   make docs  - build the documentation site (docs/ -> docs/_build/html) with every warning, a
#                broken internal link included, as an error

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   := .hetfed/demo

.PHONY: install demo test lint docs bench clean test-flower-next

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

# .ci/test-deps installs the system tools the tests need (ip, nginx) where it can (root, apt-get) and
# says in one line what it could not. Real-process tests mostly wait on Flower's 3 s polling: three
# workers (one test file each) overlap them.
test: install lint
	@bash .ci/test-deps
	$(BIN)/python -m pytest -n 3 --dist loadfile

# -W: a warning is an error; -n: so is a reference that does not resolve; MyST warns for every link
# to a page, heading or repository file that does not exist (docs/contributing.md).
docs: install
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html

# make test-flower-next: the fast tier on the newest Flower pre-release in the registry, in a venv of
# its own (on demand, never in CI: a moving pre-release must not decide what lands; docs/runtime.md
# records the last result). flwr-nightly is another distribution of the same `flwr` package, so it
# goes in first, then hetfed's other requirements without flwr, then hetfed itself with --no-deps:
# nothing puts Flower's release back over the nightly. FAST_TESTS: the fast tier's pytest arguments.
FAST_TESTS  ?= -m "not slow"
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
