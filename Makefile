# Two commands for a newcomer: `make run` (the demo, end to end) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow install lint clean

$(STAMP): pyproject.toml constraints-gpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	# The training stack at the GPU machine's pins (constraints-gpu.txt), so that the CPU tests run what the GPU
	# extra installs and tests/test_gpu_setup.py checks those pins' requirements instead of skipping.
	$(BIN)/pip install -q -e ".[dev,envs,ray,postgres]" $$(grep -E '^(trl|peft|accelerate|datasets)==' constraints-gpu.txt)
	# vLLM's structured-output engines, for tests/test_grammar.py (every grammar compiled as vLLM does).
	# --no-deps: xgrammar declares triton (hundreds of MB, GPU kernels only); its other needs are above.
	$(BIN)/pip install -q --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 llguidance==1.7.6
	touch $(STAMP)

install: $(STAMP)

PORT ?= 8501
# Loopback only by default (beyond it, writes need a login); `make run ADDRESS=0.0.0.0` exposes it on purpose.
ADDRESS ?= 127.0.0.1
# The host names the browser may use (Streamlit's server.allowedHosts: refuses DNS-rebound pages); exposing it,
# name yours too: `make run ADDRESS=0.0.0.0 HOSTS="localhost 127.0.0.1 myhost.example"`.
HOSTS ?= localhost 127.0.0.1 ::1

DEMO_LOG ?= data/demo.log

# The dashboard opens at once; the demo runs beside it and the pages fill as its stages land (the
# Tree explorer follows the search live). The demo's stage times go to $(DEMO_LOG).
run: $(STAMP)
	mkdir -p $(dir $(DEMO_LOG))
	$(BIN)/orchard demo > $(DEMO_LOG) 2>&1 &
	@echo "Dashboard: http://$(ADDRESS):$(PORT)  (Ctrl-C to stop); the demo runs in the background, log: $(DEMO_LOG)"
	$(BIN)/streamlit run dashboard/app.py --server.address $(ADDRESS) --server.port $(PORT) --server.headless true \
		$(foreach h,$(HOSTS),--server.allowedHosts $(h))

# The default run (<= 5 min on 2 cores); the slow tests (real browsers, the demo, model builds,
# subprocess jobs) are the second command, which CI runs too.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m slow

# ruff, then mypy (settings and the packages it checks: pyproject.toml [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check engine dashboard tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) data/runs data/models/tiny data/jobs data/orchard.db* data/demo.log  # data/models/shipped is committed
