"""The two-level α-β-γ model: each algorithm's own cost, the fit, the prediction at scale."""

import pytest

from hpctrain.collectives import ALGORITHMS, auto, cost
from hpctrain.study import allreduce

#: Inside a node: 1 µs, 50 GB/s; between nodes: 5 µs, 1.25 GB/s (10 Gbit/s); 20 GB/s adds.
TWO_LEVEL = cost.Params(alpha=1e-6, beta=1 / 50e9, gamma=1 / 20e9, alpha_inter=5e-6,
                        beta_inter=1 / 1.25e9)


def test_every_modelled_algorithm_is_registered_and_costs_nothing_alone():
    assert set(cost.modelled()) <= set(ALGORITHMS)
    assert {"ring", "hierarchical", "mpi"} <= set(cost.modelled())
    assert "mpi" not in cost.fitted_algorithms() and "horovod" not in cost.modelled()
    assert all(cost.predict(a, 1 << 20, 1, TWO_LEVEL) == 0 for a in cost.modelled())


def test_a_one_level_model_uses_the_same_links_everywhere():
    one = cost.Params(2e-6, 1e-9, 1e-10)
    assert one.vector().tolist() == [2e-6, 1e-9, 1e-10, 2e-6, 1e-9]
    assert cost.predict("ring", 1 << 20, 8, one, nodes=4) == \
        pytest.approx(cost.predict("ring", 1 << 20, 8, one, nodes=1))


def test_hierarchical_model_matches_the_issue_ratios_on_a_slow_network():
    # β only (no latency, free reductions, free node links): the ratio of bytes per link.
    links = cost.Params(0.0, 0.0, 0.0, 0.0, 1 / 125e6)
    n = 16 << 20
    for nodes, per_node, ratio in ((2, 2, 1.5), (4, 2, 1.75 / 1.5)):
        p = nodes * per_node
        ring = cost.predict("ring", n, p, links, nodes)
        hierarchical = cost.predict("hierarchical", n, p, links, nodes)
        assert ring / hierarchical == pytest.approx(ratio)


def test_two_level_fit_recovers_all_five_parameters():
    points = [(algo, n, p, cost.predict(algo, n, p, TWO_LEVEL, -(-p // 2)), -(-p // 2))
              for algo in ("ring", "butterfly", "tree", "hierarchical") for p in (2, 4, 8)
              for n in (8, 4096, 1 << 20, 16 << 20)]
    assert cost.determined(points)
    fitted = cost.fit(points)
    assert fitted.vector() == pytest.approx(TWO_LEVEL.vector(), rel=1e-6)
    assert allreduce.fit_plan(points, cores=2) == ([2, 4, 8], True)


def test_one_node_points_leave_the_links_between_nodes_unfitted():
    points = [(algo, n, p, cost.predict(algo, n, p, TWO_LEVEL))
              for algo in ("ring", "butterfly", "tree") for p in (2, 3, 4)
              for n in (8, 4096, 1 << 20)]
    fitted = cost.fit(points)
    assert fitted.alpha_inter is None and fitted.beta_inter is None
    assert (fitted.alpha, fitted.beta, fitted.gamma) == \
        pytest.approx((TWO_LEVEL.alpha, TWO_LEVEL.beta, TWO_LEVEL.gamma), rel=1e-6)
    assert cost.Params.from_dict(fitted.as_dict()) == fitted


def test_a_fit_held_at_zero_is_the_non_negative_optimum():
    # Times that shrink with the size ask for negative per-byte costs: β and γ must stay at
    # zero and α be refitted alone. The optimality (KKT) conditions of non-negative least
    # squares on relative error, checked here without any solver: the gradient vanishes on
    # every positive parameter and points outward (>= 0) on every zero one.
    points = [(algo, n, p, 1e-5 * (1 - 0.01 * n.bit_length()) * (1 + 0.1 * (p - 2)))
              for algo in ("ring", "tree", "butterfly") for p in (2, 3, 4)
              for n in (8, 4096, 1 << 20)]
    fitted = cost.fit(points)
    assert fitted.alpha > 0 and fitted.beta == 0 and fitted.gamma == 0
    rows = [cost.coefficients(a, n, p) for a, n, p, _ in points]
    design = [[c / t for c in row[:3]] for row, (*_, t) in zip(rows, points)]
    x = fitted.vector()[:3]
    residual = [sum(d * v for d, v in zip(row, x)) - 1 for row in design]
    for j, value in enumerate(x):
        column = [row[j] for row in design]
        scale = sum(c * c for c in column) ** 0.5 * sum(r * r for r in residual) ** 0.5
        gradient = sum(c * r for c, r in zip(column, residual)) / scale
        assert gradient == pytest.approx(0, abs=1e-9) if value > 0 else gradient >= -1e-9


def test_at_512_nodes_of_8_the_hierarchical_allreduce_wins_large_messages():
    p, nodes, n = 4096, 512, 256 << 20
    times = {a: cost.predict(a, n, p, TWO_LEVEL, nodes) for a in cost.modelled()}
    assert min(times, key=times.get) == "hierarchical"
    assert times["ring"] / times["hierarchical"] > 1.05
    # Small messages: latency; the butterfly's lg p beats both rings.
    small = {a: cost.predict(a, 8, p, TWO_LEVEL, nodes) for a in auto.model_choices()}
    assert min(small, key=small.get) == "butterfly"


def test_auto_chooses_hierarchical_from_a_two_level_profile():
    profile = auto.Profile.from_dict({"fitted": TWO_LEVEL.as_dict(),
                                      "p2p_prior": TWO_LEVEL.as_dict(), "ranks_per_node": 8})
    assert "hierarchical" in auto.model_choices()
    assert profile.choose(256 << 20, 4096) == "hierarchical"
    one_node = auto.Profile.from_dict({"fitted": TWO_LEVEL.as_dict(),
                                       "p2p_prior": TWO_LEVEL.as_dict()})
    assert one_node.choose(256 << 20, 4096) != "hierarchical"


def test_the_other_collectives_carry_their_costs_beside_allreduce():
    # n = 4 MiB on p = 4 (a power of two) and p = 3 (one folded pair).
    n = 4 << 20
    assert cost.coefficients("ring", n, 4, collective="allgather") == (3, 0.75 * n, 0, 0, 0)
    assert cost.coefficients("butterfly", n, 4, collective="allgather") == \
        (2, 0.75 * n, 0, 0, 0)
    assert cost.coefficients("butterfly", n, 3, collective="reducescatter") == \
        (3, 0.5 * n + n + n / 3, 1.5 * n, 0, 0)
    assert cost.coefficients("pairwise", n, 4, collective="alltoall")[:2] == (3, 0.75 * n)
    # The ring allreduce is its reduce-scatter and its allgather, in time as in code.
    both = [a + b for a, b in zip(cost.coefficients("ring", n, 4, collective="reducescatter"),
                                  cost.coefficients("ring", n, 4, collective="allgather"))]
    assert tuple(both) == cost.coefficients("ring", n, 4)
    # The fit and auto see allreduce algorithms only.
    assert "pairwise" not in cost.modelled()
    with pytest.raises(KeyError, match="no cost formula for alltoall 'mpi'"):
        cost.coefficients("mpi", n, 4, collective="alltoall")


def test_scatter_allgather_broadcast_beats_the_tree_only_for_large_messages():
    n = 4 << 20
    assert cost.coefficients("tree", n, 5, collective="broadcast") == (3, 3 * n, 0, 0, 0)
    assert cost.coefficients("scatter_allgather", n, 4, collective="broadcast") == \
        (5, 1.5 * n, 0, 0, 0)
    # The tree allreduce is a reduce then this broadcast: its second half, in time as in code.
    assert cost.coefficients("tree", n, 8, collective="broadcast")[:2] == \
        tuple(c / 2 for c in cost.coefficients("tree", n, 8)[:2])
    machine = cost.Params(alpha=20e-6, beta=1e-9, gamma=0.0)
    for p in (3, 4, 8):
        def time(algo, nbytes, p=p):
            return cost.predict(algo, nbytes, p, machine, collective="broadcast")
        assert time("scatter_allgather", 64 << 20) < time("tree", 64 << 20)
        assert time("scatter_allgather", 1024) > time("tree", 1024)
    assert cost.predict("tree", n, 1, machine, collective="broadcast") == 0.0


def test_the_tree_reduce_is_the_tree_allreduces_first_half():
    n = 4 << 20
    # ceil(lg 5) = 3 rounds, each the whole vector received and reduced on the root's path.
    assert cost.coefficients("tree", n, 5, collective="reduce") == (3, 3 * n, 3 * n, 0, 0)
    # On one node the tree allreduce is this reduce then the tree broadcast, in time as in
    # code (tree.reduce, then tree.broadcast).
    for p in (2, 3, 4, 7, 8):
        both = [a + b for a, b in zip(cost.coefficients("tree", n, p, collective="reduce"),
                                      cost.coefficients("tree", n, p, collective="broadcast"))]
        assert tuple(both) == cost.coefficients("tree", n, p), p
    assert cost.coefficients("tree", n, 4, nodes=2, collective="reduce") == \
        (0, 0, 2 * n, 2, 2 * n)
    with pytest.raises(KeyError, match="no cost formula for reduce 'mpi'; modelled: tree"):
        cost.coefficients("mpi", n, 4, collective="reduce")


def test_the_tree_charges_only_its_rounds_across_nodes_to_the_links_between_them():
    from hpctrain.collectives.tree import rounds_across_nodes

    n = 1000.0
    # 8 ranks, 2 nodes of 4 by slot: rounds of distance 1 and 2 stay inside, 4 crosses.
    assert rounds_across_nodes(8, 2) == 1
    assert cost.coefficients("tree", n, 8, 2) == (4, 4 * n, 3 * n, 2, 2 * n)
    # 4 ranks on 2 nodes of 2: distance 1 inside, distance 2 across.
    assert cost.coefficients("tree", n, 4, 2) == (2, 2 * n, 2 * n, 2, 2 * n)
    # One rank a node, or one node: every round on one kind of link, as the flat formula.
    assert cost.coefficients("tree", n, 4, 4) == (0, 0, 2 * n, 4, 4 * n)
    assert cost.coefficients("tree", n, 5, 1) == (6, 6 * n, 3 * n, 0, 0)
    # 6 ranks on 2 nodes of 3 (0-2, 3-5): distance 1 pairs (2, 3) across, distance 2
    # (0, 2) and (4, ...) not: (4, 6) has no 6; distance 4 (0, 4) across.
    assert rounds_across_nodes(6, 2) == 2
    # Rooted at 2 on 4 ranks of 2 nodes: virtual ranks 0..3 are ranks 2, 3, 0, 1, so the
    # distance-1 pairs (2, 3), (0, 1) stay inside and distance 2, (2, 0), crosses.
    assert rounds_across_nodes(4, 2, 2) == 1
    # Rooted at 1: pairs (1, 2) and (3, 0) cross at distance 1; (1, 3) at distance 2.
    assert rounds_across_nodes(4, 2, 1) == 2
    assert cost.coefficients("tree", n, 4, 2, root=1) == (0, 0, 2 * n, 4, 4 * n)
