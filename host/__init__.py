"""Host runtime: checkpoint loading, partitioning, compiler to the ISA, devices, generation, CLI.

Nothing here imports Amaranth: the ISA definition is the one thing host and hardware share.
"""
