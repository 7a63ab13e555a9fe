# Two commands do all the set-up from a fresh clone: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# CPU torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	# test extras + the NPU toolchain (emulated Hexagon HTP), adbutils, boto3 + ray (S3 store, catalog on Ray),
	# so CI runs those gates too
	$(BIN)/pip install -q -e '.[test,npu,phone,cloud]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/sakura demo --out sakura-demo-out

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) sakura-demo-out .pytest_cache
