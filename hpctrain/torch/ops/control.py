"""Operations that move no tensor: ``barrier``, ``join``, adding and removing process sets.

Each is paired across ranks by the engine's negotiation like any other operation, so a
barrier of one set never waits for another set's collectives, and a set is numbered alike
on every rank.
"""

from .common import announce_invalid, member_set, signature, submit, synchronize
from ..basics import world
from ...errors import ArgumentError
from ..process_sets import ProcessSet, global_process_set


def barrier(process_set=global_process_set):
    """Synchronisation point: return once every rank of ``process_set`` has called it."""
    w = world()
    pset = member_set(w, process_set, "barrier")
    name = w.next_name(pset.process_set_id, "barrier")
    handle = submit(w, pset, name, signature("barrier"), "barrier()",
                    lambda comm, infos: (None, None))
    synchronize(handle)


def join(device=-1):
    """This rank has run out of data: take part in the other ranks' allreduces with zeros
    until every rank has joined; return the rank that joined last (the same on every rank).

    Allreduces that run while some ranks have joined average over all the ranks, as in
    Horovod (the joined ones count with zeros); any other collective fails on every rank
    while a rank has joined. Afterwards every rank numbers its unnamed operations afresh
    (:meth:`World.renumber`), since the ranks made different numbers of them before joining.
    ``device`` is accepted for Horovod's signature.
    """
    w = world()
    last = w.engine.join()
    w.renumber()
    return last


def add_process_set(process_set):
    """Register a process set (a :class:`ProcessSet` of world ranks or of an mpi4py
    communicator, or a list of world ranks) and return it. Synchronisation point: every rank
    must call it, in the same order.

    Each rank may name a different set: every rank's is registered (as ``init`` does with
    its ``process_sets``), so ``ProcessSet(comm.Split(color))`` declares one set per color.
    ``ValueError`` where a set of the same ranks exists already."""
    w = world()
    pset = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if pset.process_set_id is not None:
        raise ValueError(f"{pset} is registered already")
    register_process_sets(w, [pset])
    return pset


def register_process_sets(w, psets):
    """Register every rank's ``psets`` (one operation of every rank, run on the
    communication thread): each distinct set of ranks that any rank names, once, numbered
    alike everywhere (those given by communicators first, then by ranks, each in rank order,
    as Horovod numbers them). Raises ``ValueError`` on a rank whose list names a set twice,
    or one registered already (the others are registered all the same, as in Horovod, where
    ``init`` may be called again with a list that is right)."""
    name = w.next_name(0, "process_set")
    try:
        mine = [(tuple(w.resolve_ranks(p)), p.mpi_comm is not None) for p in psets]
    except ValueError as exc:
        announce_invalid(w, global_process_set, name, f"add_process_set: {exc}")
        raise
    existing = {tuple(s.ranks) for s in w.sets.values()}

    def run(comm, infos):
        named = [entry for info in infos for entry in info or ()]
        for members in dict.fromkeys([m for m, by_comm in named if by_comm] +
                                     [m for m, by_comm in named if not by_comm]):
            if any(tuple(s.ranks) == members for s in w.sets.values()):
                continue
            pset = next((p for p, (m, _) in zip(psets, mine)
                         if m == members and p.process_set_id is None), None)
            w.register_set(pset or ProcessSet(list(members)), list(members))
        return None, None

    synchronize(submit(w, global_process_set, name, signature("add_process_sets"),
                       f"add_process_set({[list(m) for m, _ in mine]})", run, info=mine))
    for index, (pset, (members, _)) in enumerate(zip(psets, mine)):
        if pset.process_set_id is None:
            why = "exists already" if members in existing else "is named twice in this list"
            raise ArgumentError(f"a process set with ranks {list(members)} {why}: process_sets "
                                f"entry {index} ({pset}) is a duplicate")


def remove_process_set(process_set):
    """Remove a registered process set (never the global one); True if it was removed.
    Synchronisation point: every rank must call it, in the same order. Each rank may name
    a different set (the one its communicator made, say): every rank's is removed."""
    w = world()
    if (not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0)
            or process_set.process_set_id not in w.sets):
        return False
    set_id = process_set.process_set_id
    name = w.next_name(0, "process_set")

    def run(comm, infos):
        for named in dict.fromkeys(infos):
            if named in w.sets:
                w.unregister_set(named)
        return True, None

    return synchronize(submit(w, global_process_set, name, signature("remove_process_sets"),
                              f"remove_process_set({set_id})", run, info=set_id))


def start_timeline(file_path, mark_cycles=False):
    """Record every operation's phases (negotiation, data phase) from now on into a Chrome
    trace at ``file_path`` (written by rank 0; open it in Perfetto or chrome://tracing)."""
    from ..timeline import Timeline

    w = world()
    w.engine.set_timeline(Timeline(file_path, w.rank, mark_cycles=mark_cycles))


def stop_timeline():
    """Stop recording and close the trace file (nothing if none was started)."""
    world().engine.set_timeline(None)
