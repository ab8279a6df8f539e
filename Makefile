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

.PHONY: install demo test lint docs bench clean

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

bench: install
	for b in bench/[a-z]*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .hetfed .pytest_cache .ruff_cache docs/_build
