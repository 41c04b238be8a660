"""The calibrated cost model of tensor-parallel communication on GPU clusters: its equations, tables, bands
over assumptions, collective matmul's price and activation memory."""
