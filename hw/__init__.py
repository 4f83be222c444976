"""Amaranth components of the gptfpga card kernel. Synthesizable only: no file I/O, no numpy."""
