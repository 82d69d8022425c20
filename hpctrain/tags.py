"""Every MPI message tag of the package's own point-to-point messages, in one place.

A tag only keeps messages on one communicator apart, and most exchanges here run on a
private communicator of their own; one table still makes a clash visible, and a new tag is
added here. Two kinds:

- the algorithms of the collectives' registries take consecutive tags from
  :data:`FIRST_ALGORITHM_TAG` on, in the order they register
  (:func:`hpctrain.collectives.registry.register`), an order the package's imports fix alike
  on every rank;
- every other exchange has a fixed tag below. None is handed out in import order: a module
  imported on some ranks only, or later on one of them, would shift the numbers, and ranks
  would wait for messages under tags their peers never use. Each lies above every tag the
  registries reach (below :data:`ALGORITHM_TAGS_END`) and below 32767, the least
  ``MPI_TAG_UB`` the MPI standard allows.

User tags (``torch.distributed``'s ``send``/``recv``) travel on communicators of their own
and are not ours to number.
"""

#: The first tag the registries hand out.
FIRST_ALGORITHM_TAG = 11
#: The registries' tags stay below this (``tests/test_collectives_unit.py`` checks).
ALGORITHM_TAGS_END = 7000

#: ``hpctrain bench allreduce``: the reference row, one bare Sendrecv per rank pair.
BENCH_SENDRECV = 7001
#: ``hpctrain bench p2p``: ping-pong between ranks 0 and 1.
BENCH_P2P = 7002
#: ``hpctrain train``'s stall watchdog: each rank's arrival, sent to rank 0.
WATCHDOG = 7201
#: ``--regime async-server``: a worker's version and gradients to the server, the server's
#: version and weights back.
ASYNC_SERVER_PUSH, ASYNC_SERVER_GRAD = 7301, 7302
ASYNC_SERVER_VERSION, ASYNC_SERVER_WEIGHTS = 7303, 7304
#: Adasum's halves of the vector, and its dot products, between partners.
ADASUM_DATA, ADASUM_DOTS = 32001, 32002
