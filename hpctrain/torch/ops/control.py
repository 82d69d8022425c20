"""Operations that move no tensor: ``barrier``, ``join``, adding and removing process sets.

Each is paired across ranks by the engine's negotiation like any other operation, so a
barrier of one set never waits for another set's collectives, and a set is numbered alike
on every rank.
"""

from .common import member_set, submit, synchronize
from ..basics import world
from ..process_sets import ProcessSet, global_process_set


def barrier(process_set=global_process_set):
    """Synchronisation point: return once every rank of ``process_set`` has called it."""
    w = world()
    pset = member_set(w, process_set, "barrier")
    name = w.next_name(pset.process_set_id, "barrier")
    handle = submit(w, pset, name, ("barrier",), "barrier()",
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
    """Register a process set (a :class:`ProcessSet` or a list of world ranks) and return
    it. Synchronisation point: every rank must call it, in the same order."""
    w = world()
    pset = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if pset.process_set_id is not None:
        raise ValueError(f"{pset} is registered already")
    ranks = w.resolve_ranks(pset)
    name = w.next_name(0, "process_set")

    def run(comm, infos):
        return w.register_set(pset, ranks), None

    return synchronize(submit(w, global_process_set, name, ("add_process_set", tuple(ranks)),
                              f"add_process_set({ranks})", run))


def remove_process_set(process_set):
    """Remove a registered process set (never the global one); True if it was removed.
    Synchronisation point: every rank must call it, in the same order."""
    w = world()
    if (not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0)
            or process_set.process_set_id not in w.sets):
        return False
    set_id = process_set.process_set_id
    name = w.next_name(0, "process_set")

    def run(comm, infos):
        return w.unregister_set(set_id), None

    return synchronize(submit(w, global_process_set, name, ("remove_process_set", set_id),
                              f"remove_process_set({set_id})", run))


def start_timeline(file_path, mark_cycles=False):
    """Record every operation's phases (negotiation, data phase) from now on into a Chrome
    trace at ``file_path`` (written by rank 0; open it in Perfetto or chrome://tracing)."""
    from ..timeline import Timeline

    w = world()
    w.engine.set_timeline(Timeline(file_path, w.rank, mark_cycles=mark_cycles))


def stop_timeline():
    """Stop recording and close the trace file (nothing if none was started)."""
    world().engine.set_timeline(None)
