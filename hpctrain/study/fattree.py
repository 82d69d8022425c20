"""``hpctrain study fattree``: the allreduce's closed form against a flow-level simulation of a
two-level fat tree, where flows share oversubscribed uplinks.

The cost model (:mod:`hpctrain.collectives.cost`) charges every message the latency α' and
every byte β' of a host's link, as if no two flows ever shared a link. On a fat tree whose
leaf switches have fewer uplinks than hosts (oversubscription 2:1, 4:1) that holds only while
few flows leave each leaf at once. Here SimGrid (its s4u API, a flow-level model with max-min
fair sharing) runs the algorithm's messages over such a tree:

- **the tree**: ``ranks`` hosts, one rank each, ``hosts_per_leaf`` to a leaf switch; each
  host's link has a preset's bandwidth each way (:func:`.links.at_line`) and half
  its latency (a message crosses two host links, so it pays the preset's latency once); each
  leaf's uplink carries ``hosts_per_leaf x bandwidth / oversubscription`` each way, with no
  latency. The spine layer is one switch: the uplinks of a leaf are lumped into one link, the
  load balancing of a real fat tree's several spines taken as perfect;
- **placement** of ranks on hosts: ``order`` (rank r on host r), ``scatter`` (round-robin
  over the leaves: every ring neighbour on another leaf) or ``random`` (seeded);
- **the algorithm**: every rank's steps (:func:`steps`), each a synchronous exchange: send to
  one peer and receive from one, both complete, then reduce what arrived at the host's
  summing speed. ``ring``: 2(p-1) steps of n/p bytes; ``butterfly``: recursive doubling under
  the switch size, else Rabenseifner's halving then doubling, partners 1, 2, 4, ... ranks
  away first as :mod:`hpctrain.collectives.butterfly` pairs them (p a power of two).

Each point is also given the closed form's figure for the same link (one rank per node, so
the cost model's α', β' are the host link's) and :func:`estimate`: the closed form with each
step's bytes sent at the fair share of its most shared link, the flows counted by hand.

SimGrid allows one engine per process (a second one aborts it), so every simulation runs in a
child process of its own, bounded by a timeout.
"""

import importlib.machinery
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from ..data.atomic import write_json, write_text
from ..errors import UsageError
from .links import at_line

#: Where Debian's ``python3-simgrid`` puts its extension module.
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
INSTALL = "apt-get install python3-simgrid"
PLACEMENTS = ("order", "scatter", "random")
ALGOS = ("ring", "butterfly")
#: SimGrid's network model without its calibration factors (LV08's bandwidth factor 0.97 and
#: latency factor 13.01 fit TCP on Ethernet; the closed form has none), and no reverse ACK
#: traffic: the flow model the closed form assumes, sharing aside.
SIMGRID_CONFIG = ("--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                  "--log=root.thresh:critical")


@dataclass(frozen=True)
class FatTree:
    """``ranks`` hosts, one rank each, ``hosts_per_leaf`` to a leaf; a host's link has
    ``latency`` s and ``bandwidth`` bytes/s each way (the preset ``link``'s figures); a leaf's
    uplink ``hosts_per_leaf * bandwidth / oversubscription``; a host sums ``reduce_rate``
    bytes/s."""

    ranks: int
    hosts_per_leaf: int
    oversubscription: float
    link: str
    latency: float
    bandwidth: float
    reduce_rate: float

    @property
    def leaves(self):
        """The number of leaf switches."""
        return self.ranks // self.hosts_per_leaf

    @property
    def uplink_bandwidth(self):
        """Bytes/s of one leaf's uplink to the spine, each way."""
        return self.hosts_per_leaf * self.bandwidth / self.oversubscription

    def leaf(self, host):
        """The leaf switch of ``host``."""
        return host // self.hosts_per_leaf


@dataclass(frozen=True)
class Step:
    """One synchronous exchange of a rank: ``nbytes`` to ``send_to``, as many from
    ``recv_from``, then ``reduced`` bytes summed."""

    send_to: int
    recv_from: int
    nbytes: float
    reduced: float


def fat_tree(ranks, hosts_per_leaf, oversubscription, link="ib-edr", reduce_rate=100e9):
    """A :class:`FatTree`, its input checked: whole leaves, oversubscription >= 1, a known
    link preset."""
    if ranks < 2:
        raise UsageError(f"--ranks {ranks}: give 2 or more ranks")
    if hosts_per_leaf < 1 or ranks % hosts_per_leaf:
        lower = ranks // max(hosts_per_leaf, 1) * hosts_per_leaf
        raise UsageError(f"--ranks {ranks} is not a multiple of --hosts-per-leaf "
                         f"{hosts_per_leaf}: give whole leaves, e.g. "
                         f"{lower or hosts_per_leaf} or {lower + max(hosts_per_leaf, 1)}")
    if not oversubscription >= 1:
        raise UsageError(f"--oversubscription {oversubscription:g}: give 1 (non-blocking) or "
                         f"more, e.g. 2 or 4 for 2:1 or 4:1")
    preset = at_line(link)
    latency, bandwidth = preset.latency, preset.line
    return FatTree(ranks, hosts_per_leaf, float(oversubscription), link, latency, bandwidth,
                   reduce_rate)


def links(tree):
    """Every link by name: ``(bandwidth bytes/s, latency s)``, one per host and one uplink
    per leaf, each one way (a link is used in each direction independently)."""
    out = {f"host{h}": (tree.bandwidth, tree.latency / 2) for h in range(tree.ranks)}
    out.update({f"uplink{j}": (tree.uplink_bandwidth, 0.0) for j in range(tree.leaves)})
    return out


def route(tree, src, dst):
    """The links from host ``src`` to host ``dst``, each with its direction (``up`` towards
    the spine): inside a leaf the two host links, across leaves both leaves' uplinks too."""
    path = [(f"host{src}", "up")]
    if tree.leaf(src) != tree.leaf(dst):
        path += [(f"uplink{tree.leaf(src)}", "up"), (f"uplink{tree.leaf(dst)}", "down")]
    return path + [(f"host{dst}", "down")]


def placement(name, tree, seed=0):
    """The host of each rank: ``order``, ``scatter`` (rank r on leaf r mod leaves) or
    ``random`` (a permutation drawn from ``seed``)."""
    hosts = list(range(tree.ranks))
    if name == "order":
        return hosts
    if name == "scatter":
        return [(r % tree.leaves) * tree.hosts_per_leaf + r // tree.leaves for r in hosts]
    if name == "random":
        random.Random(seed).shuffle(hosts)
        return hosts
    raise UsageError(f"unknown placement {name!r}; choose from {', '.join(PLACEMENTS)}")


def steps(algo, rank, ranks, nbytes, switch_bytes):
    """Rank ``rank``'s exchanges in an allreduce of ``nbytes`` over ``ranks`` ranks; every
    rank has as many, and step i of all ranks pair up (a rank receives from the one that
    sends to it)."""
    if algo == "ring":
        right, left, chunk = (rank + 1) % ranks, (rank - 1) % ranks, nbytes / ranks
        return [Step(right, left, chunk, chunk if i < ranks - 1 else 0.0)
                for i in range(2 * (ranks - 1))]
    if algo == "butterfly":
        if ranks & (ranks - 1):
            raise UsageError(f"butterfly is simulated at power-of-two rank counts only, got "
                             f"{ranks}: give 16, 64, 256, ... or --algos ring")
        masks = [1 << k for k in range(ranks.bit_length() - 1)]
        if nbytes < switch_bytes:
            return [Step(rank ^ m, rank ^ m, nbytes, nbytes) for m in masks]
        halving = [Step(rank ^ m, rank ^ m, nbytes / 2 ** (k + 1), nbytes / 2 ** (k + 1))
                   for k, m in enumerate(masks)]
        return halving + [Step(s.send_to, s.recv_from, s.nbytes, 0.0) for s in reversed(halving)]
    raise UsageError(f"unknown algorithm {algo!r} for the fat tree; choose from "
                     f"{', '.join(ALGOS)}")


def switch_bytes():
    """The butterfly's switch from recursive doubling to Rabenseifner, as the cost model
    takes it by default."""
    from ..collectives.registry import ALGORITHMS

    return ALGORITHMS["butterfly"].options["switch_bytes"]


def closed_form(tree, algo, nbytes):
    """Seconds the cost model predicts: a cluster of one rank per node on the tree's link
    preset, the ranks spread over ``ranks`` nodes."""
    from ..collectives import cost
    from .planner import nominal_cluster

    cluster = nominal_cluster(1, tree.link, tree.link, reduce_rate=tree.reduce_rate)
    return cost.predict(algo, nbytes, tree.ranks, cluster.params, tree.ranks,
                        ranks_per_node=1)


def estimate(tree, hosts, algo, nbytes):
    """The closed form with contention counted by hand: all ranks take step i together; each
    flow gets the fair share of its most shared link (capacity / flows on it, each way), the
    step lasts the latency, the slowest flow and the largest reduction."""
    capacity, switch = links(tree), switch_bytes()
    plans = [steps(algo, r, tree.ranks, nbytes, switch) for r in range(tree.ranks)]
    total = 0.0
    for i in range(len(plans[0])):
        flows = [(route(tree, hosts[r], hosts[plan[i].send_to]), plan[i].nbytes)
                 for r, plan in enumerate(plans)]
        load = {}
        for path, _ in flows:
            for hop in path:
                load[hop] = load.get(hop, 0) + 1
        slowest = max(nbytes_i / min(capacity[name][0] / load[(name, way)]
                                     for name, way in path)
                      for path, nbytes_i in flows)
        reduced = max(plan[i].reduced for plan in plans)
        total += tree.latency + slowest + reduced / tree.reduce_rate
    return total


# ----- SimGrid ----------------------------------------------------------------------------------

def simgrid_spec():
    """Where ``simgrid`` can be imported from, or ``None``.

    From the interpreter's own path first. Else Debian's ``python3-simgrid``, made for
    Debian's own Python 3.11, taken from its folder only where this interpreter accepts the
    file's ABI tag (``find_spec`` matches it against this interpreter's extension suffixes,
    ``.cpython-311-x86_64-linux-gnu.so`` for any CPython 3.11): the module links against
    libsimgrid, not libpython, and CPython keeps its ABI within a minor version. Checked
    from another CPython 3.11 build: the same simulated times as under Debian's, to the last
    digit, in the same wall time. Only the one module is loaded from that folder, not
    the folder put on ``sys.path`` (its other packages would shadow nothing, but are not ours).
    """
    spec = importlib.util.find_spec("simgrid")
    if spec is None:
        spec = importlib.machinery.PathFinder.find_spec("simgrid", [DEBIAN_DIST_PACKAGES])
    return spec


def require_simgrid():
    """Fail with what to install when SimGrid cannot be imported."""
    if simgrid_spec() is None:
        raise UsageError(f"study fattree needs SimGrid's Python module, not found for "
                         f"{sys.executable} (Python {sys.version.split()[0]}): {INSTALL} "
                         f"(Debian 12's 3.32 works with any Python 3.11)")


def load_simgrid():
    """The ``simgrid`` module (see :func:`simgrid_spec`)."""
    if "simgrid" in sys.modules:
        return sys.modules["simgrid"]
    require_simgrid()
    spec = simgrid_spec()
    module = importlib.util.module_from_spec(spec)
    sys.modules["simgrid"] = module
    spec.loader.exec_module(module)
    return module


def simulate(tree, algo, nbytes, hosts, timeout=600):
    """``(simulated s, wall s)`` of one allreduce on ``tree`` with ranks on ``hosts``, run in a
    child process (one SimGrid engine per process) that must end within ``timeout`` s."""
    require_simgrid()
    spec = {"tree": asdict(tree), "algo": algo, "nbytes": nbytes, "hosts": hosts,
            "switch_bytes": switch_bytes()}
    start = time.perf_counter()
    try:
        child = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(spec),
                               capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UsageError(f"the simulation of {algo} on {tree.ranks} ranks ran past "
                         f"--timeout {timeout} s: give a longer one or fewer ranks") from None
    if child.returncode != 0:
        raise RuntimeError(f"the SimGrid simulation failed (exit {child.returncode}):\n"
                           f"{child.stderr[-2000:]}")
    return json.loads(child.stdout)["simulated_s"], time.perf_counter() - start


def _simulate_here(spec):
    # The child's side of simulate(): build the platform, one actor per rank, run.
    sg = load_simgrid()
    tree, hosts = FatTree(**spec["tree"]), spec["hosts"]
    engine = sg.Engine(["fattree", *SIMGRID_CONFIG])
    zone = sg.NetZone.create_full_zone("fattree")
    machines = [zone.create_host(f"h{h}", tree.reduce_rate).seal() for h in range(tree.ranks)]
    made = {name: zone.create_split_duplex_link(name, bw).set_latency(lat).seal()
            for name, (bw, lat) in links(tree).items()}
    way = {"up": sg.LinkInRoute.Direction.UP, "down": sg.LinkInRoute.Direction.DOWN}
    for a in range(tree.ranks):
        for b in range(a + 1, tree.ranks):
            # Symmetrical: SimGrid adds b -> a with the links reversed and UP/DOWN swapped.
            path = [sg.LinkInRoute(made[name], way[d]) for name, d in route(tree, a, b)]
            zone.add_route(machines[a].netpoint, machines[b].netpoint, None, None, path, True)
    zone.seal()
    finished = []

    def rank(r):
        for step in steps(spec["algo"], r, tree.ranks, spec["nbytes"], spec["switch_bytes"]):
            # Post the send before the receive: every rank does, so no pair waits on itself.
            sent = sg.Mailbox.by_name(f"{step.send_to}<{r}").put_async(r, round(step.nbytes))
            sg.Mailbox.by_name(f"{r}<{step.recv_from}").get()
            sent.wait()
            if step.reduced:
                sg.this_actor.execute(step.reduced)   # a host's speed is its summing rate
        finished.append(sg.Engine.clock)

    for r, host in enumerate(hosts):
        sg.Actor.create(f"rank{r}", machines[host], rank, r)
    engine.run()
    return {"simulated_s": max(finished)}


# ----- the command -----------------------------------------------------------------------------

def compare(tree, algo, nbytes, placement_name, seed=0, timeout=600):
    """One row: the closed form, the hand count and the simulation of one point."""
    hosts = placement(placement_name, tree, seed)
    simulated, wall = simulate(tree, algo, nbytes, hosts, timeout)
    closed = closed_form(tree, algo, nbytes)
    return {"ranks": tree.ranks, "leaves": tree.leaves, "hosts_per_leaf": tree.hosts_per_leaf,
            "oversubscription": tree.oversubscription, "placement": placement_name,
            "algo": algo, "nbytes": nbytes, "closed_form_s": closed,
            "estimate_s": estimate(tree, hosts, algo, nbytes), "simulated_s": simulated,
            "ratio": simulated / closed, "wall_s": wall}


def run(args):
    """``study fattree``: every point simulated and compared, a line each as it ends;
    summary.md and fattree.json in --out."""
    from ..units import parse_size
    from .plan import _names
    from .sweep import rank_counts

    ranks = rank_counts(args.ranks, minimum=2, option="--ranks")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    factors = [_factor(s) for s in args.oversubscription.split(",") if s.strip()]
    placements = _names(args.placements, PLACEMENTS, "--placements")
    algos = _names(args.algos, ALGOS, "--algos")
    trees = [fat_tree(p, args.hosts_per_leaf, o, args.link, args.reduce_rate * 1e9)
             for p in ranks for o in factors]
    for tree in trees:
        for algo in algos:
            steps(algo, 0, tree.ranks, 1, 0)        # bad rank counts fail before any run
    require_simgrid()
    print(f"# fat tree: {args.hosts_per_leaf} hosts per leaf, {args.link} host links, "
          f"reduction {args.reduce_rate:g} GB/s, seed {args.seed}; SimGrid CM02 flow model",
          flush=True)
    print(f"# {'ranks':>5} {'over':>4} {'algo':>9} {'size':>10} {'placement':>9} "
          f"{'closed s':>10} {'estimate s':>10} {'simulated s':>11} {'ratio':>6} "
          f"{'wall s':>6}", flush=True)
    rows, started = [], time.perf_counter()
    for tree in trees:
        for algo in algos:
            for nbytes in sizes:
                for name in placements:
                    row = compare(tree, algo, nbytes, name, args.seed, args.timeout)
                    rows.append(row)
                    print(_line(row), flush=True)
    total = time.perf_counter() - started
    os.makedirs(args.out, exist_ok=True)
    text = summary(rows, args, total)
    write_text(os.path.join(args.out, "summary.md"), text)
    write_json(os.path.join(args.out, "fattree.json"),
               {"hosts_per_leaf": args.hosts_per_leaf, "link": args.link,
                "reduce_rate": args.reduce_rate * 1e9, "seed": args.seed,
                "simgrid_config": list(SIMGRID_CONFIG), "wall_s": total, "rows": rows})
    print(f"# {len(rows)} simulations in {total:.1f} s; {args.out}/summary.md")
    return 0


def _line(row):
    return (f"  {row['ranks']:>5} {row['oversubscription']:>4g} {row['algo']:>9} "
            f"{row['nbytes']:>10} {row['placement']:>9} {row['closed_form_s']:>10.4g} "
            f"{row['estimate_s']:>10.4g} {row['simulated_s']:>11.4g} {row['ratio']:>6.2f} "
            f"{row['wall_s']:>6.1f}")


def _factor(text):
    try:
        return float(text.removesuffix(":1"))
    except ValueError:
        raise UsageError(f"--oversubscription {text!r}: give factors such as 1,2,4 (or 4:1)") \
            from None


def summary(rows, args, wall_s):
    """The comparison's markdown: the tree, then one row per point."""
    from ..bench.sizes import format_size

    lines = ["# Allreduce on a fat tree: closed form against SimGrid", "",
             f"- two-level fat tree, {args.hosts_per_leaf} hosts per leaf, one rank per host; "
             f"host links {args.link}; each leaf's uplink {args.hosts_per_leaf} x the host "
             f"link / oversubscription",
             f"- reduction {args.reduce_rate:g} GB/s per host; random placement seed "
             f"{args.seed}; SimGrid {' '.join(SIMGRID_CONFIG)}",
             f"- {len(rows)} simulations in {wall_s:.1f} s", ""]
    blocking = [abs(r["ratio"] - 1) for r in rows if r["oversubscription"] == 1]
    if blocking:
        lines += [f"Non-blocking (1:1): the simulation within {max(blocking):.1e} of the closed "
                  f"form (largest relative difference over {len(blocking)} points).", ""]
    lines += ["| ranks | size | oversubscription | algo | placement | closed form s | "
              "estimate s | simulated s | simulated / closed | wall s |",
              "|---:|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['ranks']} | {format_size(r['nbytes'])} | {r['oversubscription']:g}:1 | "
              f"{r['algo']} | {r['placement']} | {r['closed_form_s']:.4g} | "
              f"{r['estimate_s']:.4g} | {r['simulated_s']:.4g} | {r['ratio']:.3f} | "
              f"{r['wall_s']:.1f} |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    json.dump(_simulate_here(json.load(sys.stdin)), sys.stdout)
