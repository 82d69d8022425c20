"""The ``hpctrain`` process group: every c10d collective as one operation of hpctrain.torch's
engine, over the world's process sets.

A group is a process set of :mod:`hpctrain.torch` (the default group is its global set; each
``new_group``, and so each ``DeviceMesh`` dimension, a set of its own, with its own
communicator). Each call checks its arguments on the caller's thread (a bad one there is
raised there and announced to the group's other ranks, which fail with its reason), then
queues one request on the communication thread (:mod:`hpctrain.torch.engine`): the ranks of
the group pair their N-th calls, compare what they passed (shapes, dtypes, op, root; a
mismatch fails on every rank with what each passed) and run the data phase with the
algorithm of :mod:`hpctrain.collectives` that the world's allreduce names
(``HPCTRAIN_ALLREDUCE``; ``collectives.companion`` for the others). Its torch future is
completed there (:mod:`.work`). ``gather`` and ``scatter`` are alltoalls in which only the
root's blocks are not empty; ``send`` and ``recv`` are MPI's own (:mod:`.p2p`).
"""

import warnings

import torch
import torch.distributed as dist

from . import p2p
from .reductions import (allreduce_flat, check_dtype, reduce_scatter_flat, reduce_to_root,
                         reduction)
from .rendezvous import c10d_local, thread_level_problem
from .versions import PENDING, handed_out
from .work import FutureHandle, Work, seconds
from .. import basics
from ..engine import Request
from ..ops.common import (check_tensor, describe_tensors, dtype_name, on_thread, signature,
                          start, submit, synchronize)
from ..process_sets import ProcessSet, global_process_set
from ...errors import UsageError

#: The backend's name, for ``dist.init_process_group``.
BACKEND = "hpctrain"
#: The largest tag MPI must accept (the standard's lower bound on ``MPI_TAG_UB``).
MAX_TAG = 32767


def _flat(tensor):
    """A contiguous 1-D view of ``tensor``, or a contiguous copy (``(flat, copied)``)."""
    if tensor.is_contiguous():
        return tensor.view(-1), False
    return tensor.contiguous().view(-1), True


def _tensor_list(tensors, function):
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError(f"{function}: expected a list of tensors, got {tensors!r}")
    return tensors


def _root(opts, size, function):
    root = opts.rootRank
    if not 0 <= root < size:
        raise ValueError(f"{function}: root rank {root} is not a rank of the group: valid "
                         f"ranks are 0 to {size - 1}")
    return root


class ProcessGroupHpctrain(dist.ProcessGroup):
    """A ``torch.distributed`` process group over a process set of hpctrain.torch's world.

    Built by the backend's creator (the default group) and by :meth:`new_group` (the
    others); ``dist.init_process_group("hpctrain")`` and ``dist.new_group`` make them.
    ``timeout``: their ``timeout=`` in seconds (``None``: none); a collective that some rank
    of the group has not called within it fails on every rank (:mod:`hpctrain.torch.engine`'s
    ``StallInspector.expired``).
    """

    def __init__(self, world, pset, p2p_comm, group_name="", group_desc="", owns_world=False,
                 timeout=None):
        super().__init__(pset.rank(), pset.size())
        self.world, self.pset, self.p2p_comm = world, pset, p2p_comm
        self.timeout = timeout
        self.owns_world = owns_world            # shut the world down with this group
        self._name, self._desc = group_name, group_desc
        self._closed = False

    # ----- what torch asks of a Python group -----------------------------------------------

    def getBackendName(self):  # noqa: N802 - torch's name
        """``"hpctrain"``."""
        return BACKEND

    def name(self):
        """``"hpctrain"``."""
        return BACKEND

    def getGroupName(self):  # noqa: N802 - torch's name
        """The name torch gave this group."""
        return self._name

    def setGroupName(self, name):  # noqa: N802 - torch's name
        """Called by torch once the group is made."""
        self._name = name

    def getGroupDesc(self):  # noqa: N802 - torch's name
        """The description torch gave this group."""
        return self._desc

    def setGroupDesc(self, desc):  # noqa: N802 - torch's name
        """Called by torch once the group is made."""
        self._desc = desc

    # torch 2.5's bindings of these set the C++ group's name without calling the two above
    # (2.7 and later do): the functional collectives would find a group named "".

    def _set_group_name(self, name):
        self.setGroupName(name)
        super()._set_group_name(name)

    def _set_group_desc(self, desc):
        self.setGroupDesc(desc)
        super()._set_group_desc(desc)

    @property
    def group_name(self):
        """The name torch gave this group."""
        return self._name

    @property
    def group_desc(self):
        """The description torch gave this group."""
        return self._desc

    # ----- one operation -------------------------------------------------------------------

    def _queue(self, function, tensors, check, work, outputs, agreed=None, opts=None):
        """Check, then queue one operation; return its :class:`~.work.Work`.

        ``check()`` runs here and returns what the ranks must agree on (added to the
        signature) and what each rank tells the others (``info``); ``work(comm, infos)``
        runs on the communication thread; ``outputs`` is the future's value. ``agreed``:
        the tensors whose shapes, dtypes and devices every rank must pass alike (default
        all; an alltoall's, a gather's and a scatter's differ by rank). ``opts``: the call's
        options, whose ``timeout``, where set (``dist.barrier(timeout=)``), replaces the
        group's.
        """
        def checked(pset):
            for t in tensors:
                check_tensor(t, function, reduced=False)
            return check()

        w, pset, name, (extra, info) = start(function, None, self.pset, checked)
        kind = function.split(".")[-1]
        signed = tensors if agreed is None else agreed
        request = Request(pset.process_set_id, name, signature(kind, signed, extra=extra),
                          describe_tensors(kind, name, tensors), on_thread(tensors, work),
                          info, timeout=self._timeout_s(opts))
        request.handle = FutureHandle(lambda result: outputs)
        w.engine.submit(request)
        return handed_out(Work(request.handle))

    def _timeout_s(self, opts):
        limit = seconds(getattr(opts, "timeout", None))
        return self.timeout if limit is None else limit

    def _algo(self, collective):
        return self.world.algorithm_for(collective)

    # ----- reductions ----------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        """Reduce each tensor in place over the group (every ``ReduceOp``)."""
        return self._allreduce("dist.all_reduce", _tensor_list(tensors, "all_reduce"), opts)

    def allreduce_coalesced(self, tensors, opts=None):
        """Reduce every tensor in place, packed into one buffer per dtype."""
        return self._allreduce("dist.all_reduce_coalesced",
                               _tensor_list(tensors, "all_reduce_coalesced"), opts)

    def _allreduce(self, function, tensors, opts):
        reduce_op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        if len(tensors) == 1 and tensors[0].is_sparse:
            return self._sparse_allreduce(function, tensors[0], reduce_op, opts)
        chosen = reduction(reduce_op)

        def check():
            for t in tensors:
                check_dtype(t, chosen, function)
            return chosen, None

        w = self.world

        def work(comm, infos):
            from ..buckets import FlatBuffer

            groups = {}
            for t in tensors:
                groups.setdefault((t.dtype, t.device), []).append(t)
            for group in groups.values():
                if len(group) == 1 and group[0].is_contiguous():
                    allreduce_flat(comm, w.algo, self._algo("allgather"), group[0].view(-1),
                                   chosen)
                    continue
                packed = FlatBuffer(group)
                packed.pack(group)
                allreduce_flat(comm, w.algo, self._algo("allgather"), packed.flat, chosen)
                packed.unpack(group)
            return tensors
        return self._queue(function, tensors, check, work, tensors, opts=opts)

    def _sparse_allreduce(self, function, tensor, reduce_op, opts):
        """The sum of a sparse COO ``tensor`` over the group, in place and coalesced, as
        gloo's: every rank's indices and values are gathered (each rank's count of
        non-zeros travels with the negotiation) and summed. ``ReduceOp.SUM`` only, as gloo."""
        coalesced = tensor.coalesce()
        indices = coalesced.indices().t().contiguous()     # one row per non-zero
        values = coalesced.values().contiguous()
        width = int(torch.Size(values.shape[1:]).numel())  # a hybrid tensor's dense part

        def check():
            name = reduction(reduce_op).name
            if name != "SUM":
                raise RuntimeError(f"{function}: sparse tensors are reduced with "
                                   f"ReduceOp.SUM only (as gloo), got ReduceOp.{name}; "
                                   f"reduce tensor.to_dense() for other ops")
            return (tuple(tensor.shape), tensor.sparse_dim(), dtype_name(values)), \
                values.shape[0]

        def work(comm, infos):
            counts = [int(n) for n in infos]
            rows = torch.empty((sum(counts), indices.shape[1]), dtype=indices.dtype,
                               device=indices.device)
            self._allgather_flat(comm, indices, rows.view(-1),
                                 [n * indices.shape[1] for n in counts])
            gathered = torch.empty((sum(counts), *values.shape[1:]), dtype=values.dtype,
                                   device=values.device)
            self._allgather_flat(comm, values, gathered.view(-1), [n * width for n in counts])
            tensor.copy_(torch.sparse_coo_tensor(rows.t(), gathered, tensor.shape,
                                                 check_invariants=False).coalesce())
            return [tensor]
        return self._queue(function, [indices, values], check, work, [tensor], agreed=[],
                           opts=opts)

    def reduce(self, tensors, opts=None):
        """Reduce ``tensors[0]`` over the group into the root's (others' may be overwritten)."""
        opts = dist.ReduceOptions() if opts is None else opts
        tensors = _tensor_list(tensors, "reduce")
        chosen = reduction(opts.reduceOp)
        tensor = tensors[0]

        def check():
            check_dtype(tensor, chosen, "dist.reduce")
            return (chosen, _root(opts, self.size(), "dist.reduce")), None

        def work(comm, infos):
            flat, copied = _flat(tensor)
            reduce_to_root(comm, self.world, flat, opts.rootRank, chosen)
            if copied:
                tensor.copy_(flat.view(tensor.shape))
            return tensors
        return self._queue("dist.reduce", tensors, check, work, tensors, opts=opts)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        """Reduce every rank's list of blocks; this rank's block into ``output_tensors[0]``."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        output, inputs = output_tensors[0], list(input_lists[0])
        chosen = reduction(opts.reduceOp)

        def check():
            self._blocks("dist.reduce_scatter", output, inputs)
            check_dtype(output, chosen, "dist.reduce_scatter")
            return (chosen, tuple(t.numel() for t in inputs)), None

        def work(comm, infos):
            send = torch.cat([t.reshape(-1) for t in inputs])
            self._reduce_scatter_into(comm, send, output, [t.numel() for t in inputs], chosen)
            return [output]
        return self._queue("dist.reduce_scatter", [output, *inputs], check, work, [output],
                           opts=opts)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        """``reduce_scatter_tensor``: ``input`` holds ``size`` equal blocks."""
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """``reduce_scatter_tensor`` of several pairs (FSDP2's gradients), one operation."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        outputs, inputs = list(outputs), list(inputs)
        chosen = reduction(opts.reduceOp)
        size = self.size()

        def check():
            for out, inp in zip(outputs, inputs, strict=True):
                if inp.numel() != out.numel() * size:
                    raise ValueError(f"dist.reduce_scatter_tensor: input has {inp.numel()} "
                                     f"elements, output {out.numel()}: input must hold "
                                     f"{size} x output (one block per rank)")
                if inp.dtype != out.dtype:
                    raise TypeError(f"dist.reduce_scatter_tensor: input is {inp.dtype}, "
                                    f"output {out.dtype}: they must match")
                check_dtype(out, chosen, "dist.reduce_scatter_tensor")
            return (chosen,), None

        def work(comm, infos):
            for out, inp in zip(outputs, inputs):
                self._reduce_scatter_into(comm, inp.detach().reshape(-1).clone(), out,
                                          [out.numel()] * size, chosen)
            return outputs
        return self._queue("dist.reduce_scatter_tensor", [*outputs, *inputs], check, work,
                           outputs, opts=opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter_into(self, comm, send, output, counts, chosen):
        flat, copied = _flat(output)
        reduce_scatter_flat(comm, self.world, send, flat, counts, chosen)
        if copied:
            output.copy_(flat.view(output.shape))

    def _blocks(self, function, mine, blocks):
        if len(blocks) != self.size():
            raise ValueError(f"{function}: {len(blocks)} tensors in the list, but the group "
                             f"has {self.size()} ranks: give one per rank")
        if blocks[self.rank()].numel() != mine.numel():
            raise ValueError(f"{function}: this rank's tensor has {mine.numel()} elements, "
                             f"its entry in the list {blocks[self.rank()].numel()}")
        if any(t.dtype != mine.dtype for t in blocks):
            raise TypeError(f"{function}: every tensor must be {mine.dtype}")

    # ----- data movement -------------------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        """Copy the root's ``tensors`` into every rank's."""
        opts = dist.BroadcastOptions() if opts is None else opts
        tensors = _tensor_list(tensors, "broadcast")

        def check():
            return (_root(opts, self.size(), "dist.broadcast"),), None

        def work(comm, infos):
            from ... import collectives

            for tensor in tensors:
                flat, copied = _flat(tensor)
                collectives.broadcast(flat, opts.rootRank, self._algo("broadcast"), comm)
                if copied:
                    tensor.copy_(flat.view(tensor.shape))
            return tensors
        return self._queue("dist.broadcast", tensors, check, work, tensors, opts=opts)

    def allgather(self, output_lists, input_tensors, opts=None):
        """Every rank's ``input_tensors[i]`` into ``output_lists[i]`` (one tensor per rank)
        on every rank."""
        return self._allgather_lists([list(outs) for outs in output_lists],
                                     list(input_tensors), "dist.all_gather", opts)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """``dist.all_gather_coalesced``: ``output_lists[r][i]`` gets rank ``r``'s
        ``input_tensors[i]`` (per rank, then per tensor: the transpose of ``allgather``'s)."""
        input_tensors = list(input_tensors)
        by_rank = [list(outs) for outs in output_lists]
        if len(by_rank) != self.size() or any(len(o) != len(input_tensors) for o in by_rank):
            def refuse():           # raised here and announced to the other ranks
                raise ValueError(f"dist.all_gather_coalesced: give {self.size()} output "
                                 f"lists (one per rank) of {len(input_tensors)} tensors each")
            return self._queue("dist.all_gather_coalesced", input_tensors, refuse, None, [],
                               opts=opts)
        by_tensor = [[outs[i] for outs in by_rank] for i in range(len(input_tensors))]
        return self._allgather_lists(by_tensor, input_tensors, "dist.all_gather_coalesced",
                                     opts, by_rank)

    def _allgather_lists(self, output_lists, input_tensors, function, opts, value=None):
        """``output_lists[i][r]`` gets rank ``r``'s ``input_tensors[i]``; one operation."""

        def check():
            for outs, inp in zip(output_lists, input_tensors, strict=True):
                self._blocks(function, inp, outs)
            return tuple(tuple(t.numel() for t in outs) for outs in output_lists), None

        def work(comm, infos):
            for outs, inp in zip(output_lists, input_tensors):
                counts = [t.numel() for t in outs]
                gathered = torch.empty(sum(counts), dtype=inp.dtype, device=inp.device)
                self._allgather_flat(comm, inp, gathered, counts)
                for out, block in zip(outs, torch.split(gathered, counts)):
                    out.copy_(block.view(out.shape))
            return output_lists
        tensors = input_tensors + [t for outs in output_lists for t in outs]
        return self._queue(function, tensors, check, work,
                           output_lists if value is None else value, opts=opts)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        """``all_gather_into_tensor``: every rank's ``input`` side by side in ``output``."""
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """``all_gather_into_tensor`` of several pairs (FSDP2's parameters), one operation."""
        outputs, inputs = list(outputs), list(inputs)
        size = self.size()

        def check():
            for out, inp in zip(outputs, inputs, strict=True):
                if out.numel() != inp.numel() * size:
                    raise ValueError(f"dist.all_gather_into_tensor: output has {out.numel()} "
                                     f"elements, input {inp.numel()}: output must hold "
                                     f"{size} x input (one block per rank)")
                if inp.dtype != out.dtype:
                    raise TypeError(f"dist.all_gather_into_tensor: input is {inp.dtype}, "
                                    f"output {out.dtype}: they must match")
            return (), None

        def work(comm, infos):
            for out, inp in zip(outputs, inputs):
                flat, copied = _flat(out)
                self._allgather_flat(comm, inp, flat, [inp.numel()] * size)
                if copied:
                    out.copy_(flat.view(out.shape))
            return outputs
        return self._queue("dist.all_gather_into_tensor", [*outputs, *inputs], check, work,
                           outputs, opts=opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _allgather_flat(self, comm, inp, recv, counts):
        from ... import collectives

        send, _ = _flat(inp.detach())
        if comm.Get_size() == 1:
            recv.copy_(send)
            return
        collectives.allgather(send, recv, counts, self._algo("allgather"), comm)

    def _alltoall_flat(self, comm, send, sendcounts, recv, recvcounts):
        from ... import collectives

        if comm.Get_size() == 1:
            recv.copy_(send)
            return
        collectives.alltoall(send, sendcounts, recv, recvcounts, self._algo("alltoall"), comm)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                          opts=None):
        """``dist.all_to_all_single``: rows of dimension 0, cut by the split sizes (equal
        blocks where they are empty)."""
        size = self.size()
        width = int(torch.Size(input.shape[1:]).numel()) if input.dim() > 1 else 1
        rows = {}

        def check():
            if input.dtype != output.dtype:
                raise TypeError(f"dist.all_to_all_single: input is {input.dtype}, output "
                                f"{output.dtype}: they must match")
            rows["out"] = self._splits(output, output_split_sizes, "output")
            rows["in"] = self._splits(input, input_split_sizes, "input")
            return (dtype_name(input),), tuple(rows["in"])

        def work(comm, infos):
            me = comm.Get_rank()
            sent = [info[me] for info in infos]
            if sent != rows["out"]:
                raise ValueError(f"dist.all_to_all_single: rank {me} expects {rows['out']} "
                                 f"rows from ranks 0 to {size - 1}, but they send {sent}")
            flat, copied = _flat(output)
            send, _ = _flat(input.detach())
            self._alltoall_flat(comm, send, [r * width for r in rows["in"]], flat,
                                [r * width for r in rows["out"]])
            if copied:
                output.copy_(flat.view(output.shape))
            return [output]
        return self._queue("dist.all_to_all_single", [output, input], check, work, [output],
                           agreed=[], opts=opts)

    alltoall_base = all_to_all_single

    def _splits(self, tensor, sizes, what):
        rows = tensor.shape[0] if tensor.dim() else tensor.numel()
        sizes = list(sizes or [])
        if not sizes:
            if rows % self.size():
                raise ValueError(f"dist.all_to_all_single: dimension 0 of the {what} ({rows} "
                                 f"rows) does not divide by the {self.size()} ranks: give "
                                 f"{what}_split_sizes that add up to it")
            return [rows // self.size()] * self.size()
        if len(sizes) != self.size() or sum(sizes) != rows or min(sizes) < 0:
            raise ValueError(f"dist.all_to_all_single: {what}_split_sizes {sizes} must give "
                             f"one count per rank ({self.size()}), adding up to dimension 0 "
                             f"of the {what} ({rows})")
        return [int(s) for s in sizes]

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """``dist.all_to_all``: ``input_tensors[j]`` to rank ``j``, rank ``i``'s into
        ``output_tensors[i]``."""
        outputs, inputs = list(output_tensors), list(input_tensors)

        def check():
            if len(outputs) != self.size() or len(inputs) != self.size():
                raise ValueError(f"dist.all_to_all: give {self.size()} input and output "
                                 f"tensors (one per rank), got {len(inputs)} and "
                                 f"{len(outputs)}")
            return (dtype_name(inputs[0]),), tuple(t.numel() for t in inputs)

        def work(comm, infos):
            me = comm.Get_rank()
            recvcounts = [t.numel() for t in outputs]
            if [info[me] for info in infos] != recvcounts:
                raise ValueError(f"dist.all_to_all: rank {me}'s output tensors hold "
                                 f"{recvcounts} elements, the ranks send "
                                 f"{[info[me] for info in infos]}")
            send = torch.cat([t.detach().reshape(-1) for t in inputs])
            recv = torch.empty(sum(recvcounts), dtype=send.dtype, device=send.device)
            self._alltoall_flat(comm, send, [t.numel() for t in inputs], recv, recvcounts)
            for out, block in zip(outputs, torch.split(recv, recvcounts)):
                out.copy_(block.view(out.shape))
            return outputs
        return self._queue("dist.all_to_all", outputs + inputs, check, work, outputs,
                           agreed=[], opts=opts)

    def gather(self, output_lists, input_tensors, opts=None):
        """Every rank's ``input_tensors[0]`` into the root's ``output_lists[0]``: an alltoall
        in which every rank sends only to the root."""
        opts = dist.GatherOptions() if opts is None else opts
        inp = input_tensors[0]
        outs = list(output_lists[0]) if output_lists else []
        size = self.size()

        def check():
            root = _root(opts, size, "dist.gather")
            if self.rank() == root:
                self._blocks("dist.gather", inp, outs)
            return (root,), None

        def work(comm, infos):
            root, me = opts.rootRank, comm.Get_rank()
            sendcounts = [inp.numel() if r == root else 0 for r in range(size)]
            recvcounts = [t.numel() for t in outs] if me == root else [0] * size
            send, _ = _flat(inp.detach())
            recv = torch.empty(sum(recvcounts), dtype=inp.dtype, device=inp.device)
            self._alltoall_flat(comm, send, sendcounts, recv, recvcounts)
            if me == root:
                for out, block in zip(outs, torch.split(recv, recvcounts)):
                    out.copy_(block.view(out.shape))
            return [outs]
        return self._queue("dist.gather", [inp, *outs], check, work, [outs], agreed=[inp],
                           opts=opts)

    def scatter(self, output_tensors, input_lists, opts=None):
        """The root's ``input_lists[0][j]`` into rank ``j``'s ``output_tensors[0]``: an
        alltoall in which only the root sends."""
        opts = dist.ScatterOptions() if opts is None else opts
        out = output_tensors[0]
        ins = list(input_lists[0]) if input_lists else []
        size = self.size()

        def check():
            root = _root(opts, size, "dist.scatter")
            if self.rank() == root:
                self._blocks("dist.scatter", out, ins)
            return (root,), None

        def work(comm, infos):
            root, me = opts.rootRank, comm.Get_rank()
            sendcounts = [t.numel() for t in ins] if me == root else [0] * size
            recvcounts = [out.numel() if r == root else 0 for r in range(size)]
            send = torch.cat([t.detach().reshape(-1) for t in ins]) if me == root else \
                torch.empty(0, dtype=out.dtype, device=out.device)
            flat, copied = _flat(out)
            self._alltoall_flat(comm, send, sendcounts, flat, recvcounts)
            if copied:
                out.copy_(flat.view(out.shape))
            return [out]
        return self._queue("dist.scatter", [out, *ins], check, work, [out], agreed=[out],
                           opts=opts)

    def barrier(self, opts=None):
        """Complete once every rank of the group has called it."""
        return self._queue("dist.barrier", [], lambda: ((), None),
                           lambda comm, infos: None, [], opts=opts)

    # ----- point to point ------------------------------------------------------------------

    def _peer(self, peer, tag, function):
        if not 0 <= peer < self.size():
            raise ValueError(f"{function}: rank {peer} is not a rank of the group: valid "
                             f"ranks are 0 to {self.size() - 1}")
        if not 0 <= tag <= MAX_TAG:
            raise ValueError(f"{function}: tag {tag} is outside 0..{MAX_TAG}, what every MPI "
                             f"accepts")

    def send(self, tensors, dst, tag=0):
        """Post the send of ``tensors[0]`` to group rank ``dst``."""
        tensor = _tensor_list(tensors, "send")[0]
        self._peer(dst, tag, "dist.send")
        return p2p.send(self.p2p_comm, tensor, dst, tag, self.timeout)

    def recv(self, tensors, src, tag=0):
        """Post the receive of ``tensors[0]`` from group rank ``src``."""
        tensor = _tensor_list(tensors, "recv")[0]
        self._peer(src, tag, "dist.recv")
        return p2p.recv(self.p2p_comm, tensor, src, tag, self.timeout)

    def recv_anysource(self, tensors, tag=0):
        """Post the receive of ``tensors[0]`` from whichever rank sends first."""
        tensor = _tensor_list(tensors, "recv")[0]
        self._peer(0, tag, "dist.recv")
        return p2p.recv(self.p2p_comm, tensor, None, tag, self.timeout)

    # ----- groups --------------------------------------------------------------------------

    def new_group(self, ranks, timeout=None, pg_options=None, group_name=None,
                  group_desc=None, **kwargs):
        """``dist.new_group`` (and every ``DeviceMesh`` dimension), called by torch on every
        rank of this default group: a new process set of ``ranks`` with its own
        communicators; ``None`` off it.

        Synchronisation point: one operation of every rank of the world (the set is made on
        the communication thread, numbered alike everywhere). A rank that does not call it
        leaves the others waiting, until the engine's deadlock verdict fails them all
        (``HPCTRAIN_DEADLOCK_S``) when that rank waits in another collective.
        """
        _warn_other_backend(ranks)
        if c10d_local("_new_group_with_tag", "use_local_synchronization"):
            raise ValueError(f"dist.new_group({sorted(ranks)}, use_local_synchronization="
                             f"True): the hpctrain backend makes every group on every rank "
                             f"of the world, so the ranks outside it must call new_group too; "
                             f"call it on every rank without use_local_synchronization")
        pset = make_set(self.world, ranks, self.timeout)
        if self.world.rank not in pset.ranks:
            return None
        return ProcessGroupHpctrain(self.world, pset, P2P_COMMS[pset.process_set_id],
                                    group_name or "", group_desc or "",
                                    timeout=seconds(timeout))

    def shutdown(self):
        """``destroy_process_group``: the default group ends hpctrain.torch's world where it
        started it (freeing every communicator, before MPI is finalised)."""
        if self._closed:
            return
        self._closed = True
        if self.owns_world and basics.is_initialized() and basics.world() is self.world:
            for comm in P2P_COMMS.values():
                if comm is not None:
                    comm.Free()
            P2P_COMMS.clear()
            self.world.duplicates.clear()
            basics.shutdown()

    def abort(self):
        """As :meth:`shutdown`."""
        self.shutdown()


def _warn_other_backend(ranks):
    """Warn where ``dist.new_group`` was asked for another backend: torch (2.13) hands every
    ``new_group`` to a default group that makes groups itself, without the ``backend=`` it was
    given, so a ``new_group(backend="nccl")`` would quietly be an ``hpctrain`` group that
    torch then reports as ``nccl``. The asked backend is read from torch's caller's frame,
    where it is there to read (nothing is said otherwise)."""
    asked = c10d_local("_new_group_with_tag", "backend")
    if asked is None or str(asked).lower() in ("hpctrain", "undefined", ""):
        return
    warnings.warn(f"dist.new_group({sorted(ranks)}, backend={str(asked)!r}) made an "
                  f"'hpctrain' group, whose collectives run over MPI, not {asked}: torch "
                  f"{torch.__version__} hands every new_group to the default group, which is "
                  f"'hpctrain' here (dist.get_backend() will still say {str(asked)!r}). For "
                  f"{asked}'s own collectives, start the default group with {asked}",
                  stacklevel=4)


#: This process's point-to-point communicator of each process set (``None`` off the set).
P2P_COMMS = {}


def p2p_duplicate(w, comm):
    """The point-to-point communicator of a set whose communicator is ``comm`` (``None`` off
    the set): a duplicate, which the world revokes with its own after a death, so that a
    receive waiting for a survivor fails too instead of waiting for ever."""
    if comm is None:
        return None
    p2p_comm = comm.Dup()
    w.duplicates.append(p2p_comm)
    return p2p_comm


def make_set(w, ranks, timeout=None):
    """A new process set of the world ranks ``ranks``, made on every rank (one operation of
    the global set, which fails on every rank if some rank has not asked for it within
    ``timeout`` seconds: the default group's), with its communicator and its point-to-point
    duplicate, even where a set of those ranks exists (torch's groups of the same ranks are
    distinct groups). A rank that makes another collective instead fails with the others.

    Ranks may ask for different groups in one call, as ``dist.new_subgroups(group=)`` makes
    them (each sub-group's ranks split it; the others split theirs): every group asked for is
    made, once, where each of its members asked for it (:func:`asked_groups`)."""
    members = sorted(int(r) for r in ranks)
    made = {}

    def register(comm, infos):
        for group in asked_groups([list(info) for info in infos]):
            pset = ProcessSet(group)
            w.register_set(pset, group, distinct=False)
            P2P_COMMS[pset.process_set_id] = p2p_duplicate(w, pset.comm)
            if group == members:
                made["set"] = pset
        return None, None

    call = start("new_group", None, global_process_set, lambda p: None)
    synchronize(submit(w, global_process_set, call.name, signature("new_group"),
                       f"dist.new_group({members}) (every rank of the default group calls "
                       f"new_group, in the same order as its collectives)", register,
                       info=tuple(members), timeout=timeout))
    return made["set"]


def asked_groups(asked):
    """The groups to make when world rank ``r`` asked for ``asked[r]``, in the order of the
    first rank that asked for each; ``ValueError`` (alike on every rank, which all hold the
    same ``asked``) where a member of a group asked for another group: no rank can be
    in two groups made by one call, and none can be left out of its own."""
    groups = []
    for group in asked:
        if group not in groups:
            groups.append(group)
    for group in groups:
        strays = [r for r in group if not 0 <= r < len(asked) or asked[r] != group]
        if strays:
            rank = strays[0]
            told = asked[rank] if 0 <= rank < len(asked) else "nothing: it is not a rank"
            raise ValueError(f"dist.new_group: a group of ranks {group} was asked for, but "
                             f"its rank {rank} asked for {told}: in one new_group call "
                             f"every member of a group asks for that same group (the other "
                             f"ranks may ask for a group of their own, as "
                             f"new_subgroups(group=) does)")
    return groups


def create(options, backend_options=None):
    """The backend's creator (``extended_api``): the default group, over hpctrain.torch's
    world (started here, over ``COMM_WORLD``, unless ``hvd.init`` started it)."""
    from ..lifecycle import init
    from ..ops.common import object_call

    if options.group_id in PENDING:         # new_group on torch < 2.13 (.versions)
        return PENDING[options.group_id]
    if list(options.global_ranks_in_group):
        raise UsageError("an hpctrain group other than the default one comes from "
                         "dist.new_group on an hpctrain default group: call "
                         "dist.init_process_group('hpctrain') first")
    from ...mpi.init import start as start_mpi

    owns = not basics.is_initialized()
    init()
    w = basics.world()
    _, short = start_mpi()      # MPI runs already: what it gave, said
    if short:                   # the same on every rank: each raises, none waits
        raise UsageError(thread_level_problem(short))
    if (options.group_rank, options.group_size) != (w.rank, w.size):
        raise UsageError(f"init_process_group gave rank {options.group_rank} of "
                         f"{options.group_size}, but MPI says rank {w.rank} of {w.size}: the "
                         f"hpctrain backend takes them from the MPI launcher; pass no rank= "
                         f"or world_size=, or launch with a matching -np")
    if 0 not in P2P_COMMS:
        P2P_COMMS[0] = object_call("c10d_p2p", None, global_process_set,
                                   lambda comm: p2p_duplicate(w, comm))
    return ProcessGroupHpctrain(w, global_process_set, P2P_COMMS[0], owns_world=owns,
                                timeout=seconds(getattr(options, "timeout", None)))
