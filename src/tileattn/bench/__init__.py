"""Benchmark suites behind `tileattn bench SUITE` (one module per suite)."""
