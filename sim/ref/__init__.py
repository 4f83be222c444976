"""numpy references that the RTL matches bit for bit."""
