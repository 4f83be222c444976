"""gptfpga: a generator of multi-FPGA GPT-2 decoding appliances, and its Python API.

    import gptfpga
    app = gptfpga.Appliance(config="configs/tiny.yaml", backend="iss", cards=2)
    print(app.generate(prompt="The machine wrote", new_tokens=16).text)

The API is :mod:`host.api` (its docstring has the full example); this package re-exports it.
"""

from importlib.metadata import PackageNotFoundError, version

from host.api import Appliance, BatchResult, CardError, Result, Stream, Token, UserError, perf

__all__ = ["Appliance", "BatchResult", "Result", "Stream", "Token", "UserError", "CardError", "perf",
           "__version__"]

try:
    __version__ = version("gptfpga")
except PackageNotFoundError:        # imported from a source tree that was never installed
    __version__ = "unknown"
