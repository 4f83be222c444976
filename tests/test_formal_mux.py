"""Formal proofs of the AXI multiplexers (sim/formal/mux.py: AxiReadMux, AxiWriteMux under
two lawful managers): the quick ones here, the deep ones in make soak."""

import pytest

from sim.formal import check
from sim.formal.mux import deep, quick


@pytest.mark.parametrize("proof", quick(), ids=lambda p: p.name)
def test_quick(proof, tmp_path):
    result = check(proof, workdir=tmp_path)
    print(result)
    assert result.passed, str(result)


@pytest.mark.soak
@pytest.mark.parametrize("proof", deep(), ids=lambda p: p.name)
def test_deep(proof, tmp_path):
    result = check(proof, workdir=tmp_path)
    print(result)
    assert result.passed, str(result)
