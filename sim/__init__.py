"""Simulation: Verilator/cocotb harnesses, HBM and link models, numpy references (sim/ref)."""
