"""What differs between the torch releases the ``hpctrain`` backend runs on.

The backend is a Python process group, and the Python process-group API of torch changed
from release to release. Measured on torch 2.5.1, 2.7.1, 2.10.0 and 2.13.0
(docs/torch-distributed.md, "Torch versions"), four things differ:

- ``dist.new_group``: torch 2.13 hands it to the default group's ``new_group`` on every
  rank. Older torch builds a sub-group itself, calling the backend's creator on the
  group's members only, where hpctrain makes every process set on every rank of the
  world. :func:`delegate_new_group` puts the 2.13 behaviour in front of torch's helper.
- ``ProcessGroup._set_group_name``: from torch 2.7 it reaches a Python group's
  ``setGroupName``; torch 2.5's does not, and the functional collectives then find a group
  with no name (:class:`~.group.ProcessGroupHpctrain` overrides it).
- ``ReduceOp.PREMUL_SUM``: only torch 2.13 hands its factor to Python (``ReduceOp.factor``);
  older torch cannot tell a Python group what to multiply by (:func:`premul_factor`).
- A work's ``wait`` called from C++: from torch 2.7 it reaches the Python work's ``wait``;
  torch 2.5's waits for the C++ base class to be marked complete, which a Python work never
  is, and hangs (the functional collectives' ``wait_tensor``; DDP, whose
  ``_broadcast_coalesced`` waits in C++ when it is built). :func:`handed_out` gives C++
  callers there a C++ work over the operation's future.

FSDP2's ``fully_shard`` moved too (:func:`fully_shard` finds it on either side).

Older than :data:`MINIMUM`, importing the backend raises ``ImportError``.
"""

import importlib
import sys

import torch

#: The oldest torch the backend runs on: the oldest release it was run on (2.5.1).
MINIMUM = (2, 5)
#: The first torch whose ``dist.new_group`` asks the default group's ``new_group``.
DELEGATES_NEW_GROUP = (2, 13)
#: The first torch (of those run) whose C++ side calls a Python work's ``wait``.
WAITS_ON_PYTHON_WORK = (2, 7)


def check_torch():
    """``ImportError`` unless the installed torch is :data:`MINIMUM` or newer."""
    if torch.__version__ < MINIMUM:
        raise ImportError(
            f"the hpctrain backend of torch.distributed needs torch >= "
            f"{'.'.join(map(str, MINIMUM))}, and this is torch {torch.__version__}: older "
            f"torch has not been run with it (hpctrain.torch, the Horovod-style API, does "
            f"not need it)")


def premul_factor(reduce_op):
    """The factor of a ``PREMUL_SUM`` ``reduce_op`` (a float); ``NotImplementedError``
    where this torch does not give it to Python."""
    if not hasattr(reduce_op, "factor"):
        raise NotImplementedError(
            f"ReduceOp.PREMUL_SUM: torch {torch.__version__} does not hand its factor to a "
            f"Python process group (ReduceOp.factor came in torch 2.13); on this torch, "
            f"scale the tensor and use ReduceOp.SUM")
    factor = reduce_op.factor
    return float(factor.item() if torch.is_tensor(factor) else factor)


def handed_out(work):
    """What a collective of the ``hpctrain`` group returns: ``work`` (a Python
    :class:`~.work.Work`), except before torch :data:`WAITS_ON_PYTHON_WORK` where the caller is
    not ``torch.distributed``'s Python API: then a C++ work that completes with ``work``'s
    future (torch's ``_create_work_from_future``), whose ``wait`` C++ can reach."""
    if torch.__version__ >= WAITS_ON_PYTHON_WORK or _python_api_calls():
        return work
    from torch._C._distributed_c10d import _create_work_from_future

    return _create_work_from_future(work.get_future())


def _python_api_calls():
    # The first frame outside this package: dist.* (distributed_c10d) waits through
    # Python; anything else (torch._ops for the functional collectives, DDP's C++ reducer,
    # torch.distributed.utils for _broadcast_coalesced) may wait in C++.
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(__package__):
        frame = frame.f_back
    return frame is not None and \
        frame.f_globals.get("__name__") == "torch.distributed.distributed_c10d"


#: Groups made by :func:`delegate_new_group` for torch's creator call that follows, by name.
PENDING = {}


def delegate_new_group(is_ours):
    """Before torch :data:`DELEGATES_NEW_GROUP`, wrap torch's ``_new_process_group_helper``
    so that a ``new_group`` of the ``hpctrain`` backend on an hpctrain default group
    (``is_ours(default_group)``) is made by that group's ``new_group``, on every rank, as
    torch 2.13 does; the helper then registers the result (its creator call takes it from
    :data:`PENDING`). Other backends, and the default group itself, go through torch's
    helper as before. Nothing on newer torch."""
    if torch.__version__ >= DELEGATES_NEW_GROUP:
        return
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    helper = c10d._new_process_group_helper
    if getattr(helper, "hpctrain", False):
        return

    def new_process_group_helper(group_size, group_rank, ranks, backend, store, group_name,
                                 *args, **kwargs):
        # The default group is made by this helper before torch records it: only calls made
        # after it are new_group's, and torch's new_group calls this on every rank (the
        # members go on to the creator, the others return at once).
        default = c10d.GroupMember.WORLD if c10d.is_initialized() else None
        if default is None or not is_ours(default) or str(backend).lower() != "hpctrain":
            return helper(group_size, group_rank, ranks, backend, store, group_name,
                          *args, **kwargs)
        made = default.new_group(ranks, timeout=kwargs.get("timeout"), group_name=group_name,
                                 group_desc=kwargs.get("group_desc"))
        if made is None:        # not a member (or ranks=[], which torch's helper would take
            return c10d.GroupMember.NON_GROUP_MEMBER, None   # for a default group)
        PENDING[group_name] = made
        try:
            return helper(group_size, group_rank, ranks, backend, store, group_name,
                          *args, **kwargs)
        finally:
            PENDING.pop(group_name, None)

    new_process_group_helper.hpctrain = True
    c10d._new_process_group_helper = new_process_group_helper


def fully_shard(module, **kwargs):
    """FSDP2's ``fully_shard(module, **kwargs)``: public in ``torch.distributed.fsdp`` from
    torch 2.6, in ``torch.distributed._composable.fsdp`` in torch 2.5."""
    try:
        from torch.distributed.fsdp import fully_shard as shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard as shard
    return shard(module, **kwargs)
