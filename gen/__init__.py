"""Config schema and validation; elaboration of the tops; Verilog, reports and packaging."""
