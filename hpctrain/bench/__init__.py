"""Benchmarks modelled on nccl-tests: ``hpctrain bench allreduce`` and ``hpctrain bench p2p``."""
