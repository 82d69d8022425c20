"""Data-parallel training: ``hpctrain train`` and ``train(config, comm)`` for in-process use.

- ``config``: the typed configuration (TOML file + ``--key=value`` overrides);
- ``loop``: ``train(config, comm) -> TrainResult``, the loop every regime shares;
- ``build``: the run's sampler, model, optimizer, regime and device from its configuration;
- ``header``: the ``#`` header and ``config.toml``; ``resume``: checkpoint compatibility;
- ``regimes``: synchronous regimes (allreduce through ``hpctrain.torch``, parameter server,
  sharded server);
- ``async_server``: the asynchronous parameter server;
- ``gradients``: the parameter servers' buckets, reduced during backward on a thread;
- ``replicas``: broadcast of rank 0's state and the identical-weights check;
- ``schedule``: linear learning-rate scaling with gradual warm-up;
- ``checkpoint``: atomic checkpoints and exact resume;
- ``report``: the header, progress bar, epoch lines and ``metrics.csv``;
- ``cli``: the ``train`` subcommand.
"""

from .config import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config", "train"]


def train(config, comm=None):
    """Train as ``config`` says over ``comm``; see ``hpctrain.train.loop.train``."""
    from .loop import train as run

    return run(config, comm)
