# Two entry points (see README): `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean system-deps generate

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/argus demo

# Prometheus, Alertmanager and VictoriaMetrics from Debian: the tests start them for real.
system-deps:
	bash scripts/system-deps.sh

test: $(STAMP) system-deps
	$(BIN)/ruff check .
	$(BIN)/pytest -q

# Every generated file the repository commits, from the defaults (tests fail on any drift):
# recording rules, alerts, Alertmanager routing and promtool tests; the Grafana dashboards and
# their provisioning; the rules' config reference in docs/rules.md.
generate: $(STAMP)
	$(BIN)/argus generate --out .
	$(BIN)/python scripts/docs.py

bench: $(STAMP)
	$(BIN)/python bench/compress.py
	$(BIN)/python bench/score.py
	$(BIN)/python bench/false_alarms.py
	$(BIN)/python bench/fault_sweep.py
	$(BIN)/python bench/attribution_sweep.py
	$(BIN)/python bench/diagnose.py
	$(BIN)/python bench/exporter_cpu.py
	$(BIN)/python bench/perfetto_write.py
	$(BIN)/python bench/processor.py
	$(BIN)/python bench/processor_soak.py
	$(BIN)/python bench/decode.py
	$(BIN)/python bench/parse.py
	$(BIN)/python bench/export_decode.py
	$(BIN)/python bench/rules_scale.py  # needs prometheus (make system-deps)
	$(BIN)/python bench/scale.py  # prometheus and victoria-metrics (make system-deps)
	$(BIN)/python bench/cardinality.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
