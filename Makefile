# Two commands do all the set-up from a fresh clone: `make demo` and `make test`.
#   make venv   .venv with torch 2.13.0 + this package and its base dependencies (`pip install -e .`): the `sakura`
#               command (demo, examples, serve, phone-agent), nothing from the extras.
#   make demo   `make venv`, then `sakura demo --out sakura-demo-out`.
#   make test   `make venv` + the extras [test,npu,phone,cloud] (pytest, ruff, playwright, transformers; the NPU
#               toolchain: onnx, onnxruntime, onnxruntime-qnn (emulated Hexagon HTP); adbutils; boto3 + ray), so CI
#               runs those gates too; then ruff + pytest. `make lint` and `make format` need the same.
#               Also `npm ci` in phone_web/ (the phone page's JavaScript: fzstd and onnxruntime-web, pinned by its package-lock.json), when
#               npm is on PATH (CI has it: the conformance test fails there without it).
# Each step has its stamp file in .venv (.installed, .installed-test); both are redone when pyproject.toml changes;
# phone_web/node_modules/.installed when the lockfile changes. A ComfyUI-Manager install of the pack needs no npm.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
NPM_STAMP := phone_web/node_modules/.installed
# torch is pinned: an unpinned torch pulls whatever the index has newest. A plain PyPI `torch==2.13.0` on Linux
# x86-64 is the CUDA build (several GB of nvidia-* wheels); for the CPU build (a ~190 MB wheel) use PyTorch's CPU
# index:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
# TORCH_INDEX is passed as `--index-url` to the torch install only. Empty by default: pip takes torch from its own
# configuration (a local wheel folder or mirror that holds torch-2.13.0+cpu gives the CPU build; PyPI the CUDA one).
TORCH_INDEX ?=

.PHONY: demo test lint format venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# base dependencies only: what `sakura demo` needs
	$(BIN)/pip install -q -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) pyproject.toml
	# test extras + the NPU toolchain (emulated Hexagon HTP), adbutils, boto3 + ray (S3 store, catalog on Ray)
	$(BIN)/pip install -q -e '.[test,npu,phone,cloud]'
	touch $(TEST_STAMP)

$(NPM_STAMP): phone_web/package.json phone_web/package-lock.json
	# the phone page's decoders (tests/phone_web): node 20 + the packages the lockfile pins, nothing else
	if command -v npm >/dev/null 2>&1; then cd phone_web && npm ci --no-audit --no-fund && touch node_modules/.installed; \
	else echo "make: npm not found: the phone page's JavaScript tests will skip (CI=true: fail)"; fi

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/sakura demo --out sakura-demo-out

test: $(TEST_STAMP) $(NPM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(TEST_STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# strips the `# fmt: skip` markers that give no `# keep:` reason, then `ruff format .` (DEVELOPERS.md, Formatting)
format: $(TEST_STAMP)
	$(BIN)/python tests/support/format_repo.py

clean:
	rm -rf $(VENV) sakura-demo-out .pytest_cache phone_web/node_modules
