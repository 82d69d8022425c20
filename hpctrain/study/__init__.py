"""Scaling studies: sweeps of the benchmarks, the α-β-γ cost model, predictions at scale."""
