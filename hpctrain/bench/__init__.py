"""Benchmarks modelled on nccl-tests: ``hpctrain bench <collective>`` (one driver, one plug-in
per collective), ``hpctrain bench p2p`` and ``hpctrain bench torch-distributed``."""
