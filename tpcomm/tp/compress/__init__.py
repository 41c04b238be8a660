"""Compressed tensor-parallel reductions: the block-quantized codec and the exchanges
that carry it under real TP."""
