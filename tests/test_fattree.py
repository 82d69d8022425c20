"""``study fattree``: the tree, the placements and the exchanges worked out by hand, bad
input, and small SimGrid simulations against the closed form (skipped, saying why, where
SimGrid is not installed)."""

import json
import subprocess
import sys

import pytest

from hpctrain.errors import UsageError
from hpctrain.study import fattree

SIMGRID = fattree.simgrid_spec() is not None
needs_simgrid = pytest.mark.skipif(not SIMGRID, reason=f"SimGrid not importable: "
                                                       f"{fattree.INSTALL}")


def _tree(ranks=8, per_leaf=4, over=1):
    return fattree.fat_tree(ranks, per_leaf, over, "ib-edr", 100e9)


def test_the_tree_has_a_link_per_host_and_an_uplink_per_leaf():
    tree = _tree(8, 4, 4)
    links = fattree.links(tree)
    assert tree.leaves == 2 and len(links) == 8 + 2
    assert links["host3"] == (12.5e9, 0.75e-6)          # half the preset's latency each
    assert links["uplink1"] == (4 * 12.5e9 / 4, 0.0)     # 4 hosts' worth over 4:1


def test_routes_stay_in_the_leaf_or_cross_both_uplinks():
    tree = _tree(8, 4)
    assert fattree.route(tree, 1, 2) == [("host1", "up"), ("host2", "down")]
    assert fattree.route(tree, 5, 0) == [("host5", "up"), ("uplink1", "up"),
                                         ("uplink0", "down"), ("host0", "down")]


@pytest.mark.parametrize("name", fattree.PLACEMENTS)
def test_every_placement_puts_each_rank_on_its_own_host(name):
    tree = _tree(24, 8)
    assert sorted(fattree.placement(name, tree, seed=3)) == list(range(24))


def test_scatter_puts_every_ring_neighbour_on_another_leaf():
    tree = _tree(12, 4)
    hosts = fattree.placement("scatter", tree)
    assert hosts[:4] == [0, 4, 8, 1]
    assert all(tree.leaf(hosts[r]) != tree.leaf(hosts[(r + 1) % 12]) for r in range(12))


def test_the_random_placement_is_the_seeds():
    tree = _tree(16, 4)
    assert fattree.placement("random", tree, 1) == fattree.placement("random", tree, 1)
    assert fattree.placement("random", tree, 1) != fattree.placement("random", tree, 2)


def test_ring_steps_send_right_receive_left_and_reduce_in_the_first_half():
    steps = fattree.steps("ring", 0, 4, 400, 0)
    assert len(steps) == 6
    assert {(s.send_to, s.recv_from, s.nbytes) for s in steps} == {(1, 3, 100)}
    assert [s.reduced for s in steps] == [100, 100, 100, 0, 0, 0]


def test_butterfly_halves_nearest_first_then_gathers_back():
    steps = fattree.steps("butterfly", 5, 8, 800, switch_bytes=64)
    assert [(s.send_to, s.nbytes, s.reduced) for s in steps] == [
        (4, 400, 400), (7, 200, 200), (1, 100, 100), (1, 100, 0), (7, 200, 0), (4, 400, 0)]
    small = fattree.steps("butterfly", 5, 8, 32, switch_bytes=64)
    assert [(s.send_to, s.nbytes) for s in small] == [(4, 32), (7, 32), (1, 32)]


@pytest.mark.parametrize("algo", fattree.ALGOS)
def test_every_rank_receives_from_the_rank_that_sends_to_it(algo):
    plans = [fattree.steps(algo, r, 8, 1 << 20, 1 << 16) for r in range(8)]
    for i in range(len(plans[0])):
        assert all(plans[plans[r][i].send_to][i].recv_from == r for r in range(8))


def test_without_contention_the_hand_count_is_the_closed_form():
    tree = _tree(16, 4, 1)
    for name in fattree.PLACEMENTS:
        hosts = fattree.placement(name, tree)
        for algo in fattree.ALGOS:
            assert fattree.estimate(tree, hosts, algo, 1 << 20) == pytest.approx(
                fattree.closed_form(tree, algo, 1 << 20), rel=1e-9)


def test_the_hand_count_sees_the_ring_in_order_cross_each_uplink_once():
    # 4 hosts per leaf at 4:1: an uplink carries one host's rate. In rank order one ring
    # flow leaves each leaf, at full rate; scattered, all four share it: a quarter each.
    tree, n = _tree(16, 4, 4), 16 << 20
    order = fattree.estimate(tree, fattree.placement("order", tree), "ring", n)
    scatter = fattree.estimate(tree, fattree.placement("scatter", tree), "ring", n)
    closed = fattree.closed_form(tree, "ring", n)
    assert order == pytest.approx(closed, rel=1e-9)
    bandwidth_s = 2 * n * 15 / 16 / tree.bandwidth
    assert scatter - closed == pytest.approx(3 * bandwidth_s, rel=1e-9)


@pytest.mark.parametrize("call, message", [
    (lambda: _tree(20, 8), "--ranks 20 is not a multiple of --hosts-per-leaf 8: give whole "
                           "leaves, e.g. 16 or 24"),
    (lambda: _tree(8, 4, 0.5), "--oversubscription 0.5: give 1"),
    (lambda: fattree.fat_tree(8, 4, 1, "30gbe"), "unknown link '30gbe'; presets: nvlink"),
    (lambda: fattree.placement("spread", _tree()), "unknown placement 'spread'; choose from "
                                                   "order, scatter, random"),
    (lambda: fattree.steps("butterfly", 0, 24, 8, 0), "power-of-two rank counts only, got 24"),
    (lambda: fattree.steps("tree", 0, 8, 8, 0), "unknown algorithm 'tree' for the fat tree; "
                                                "choose from ring, butterfly"),
])
def test_bad_input_names_what_is_wrong_and_what_would_be_right(call, message):
    with pytest.raises(UsageError, match=message):
        call()


def _study(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hpctrain", "study", "fattree",
                           "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_command_exits_2_on_bad_input(tmp_path):
    bad = _study(tmp_path, "--ranks", "12", "--hosts-per-leaf", "8")
    assert bad.returncode == 2 and "not a multiple of --hosts-per-leaf 8" in bad.stderr
    bad = _study(tmp_path, "--ranks", "16", "--placements", "order,spread")
    assert bad.returncode == 2 and "--placements: unknown spread" in bad.stderr


def test_without_simgrid_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(fattree, "simgrid_spec", lambda: None)
    with pytest.raises(UsageError, match="apt-get install python3-simgrid"):
        fattree.require_simgrid()


# ----- simulated ---------------------------------------------------------------------------------

@needs_simgrid
@pytest.mark.timeout(60)
@pytest.mark.parametrize("algo", fattree.ALGOS)
@pytest.mark.parametrize("name", fattree.PLACEMENTS)
def test_non_blocking_the_simulation_is_the_closed_form(algo, name):
    # CM02 has no calibration factors: at 1:1 nothing is shared, and a difference beyond
    # rounding would be a wrong route, direction or step in the simulated schedule.
    tree = _tree(8, 4, 1)
    simulated, _ = fattree.simulate(tree, algo, 4 << 20, fattree.placement(name, tree))
    assert simulated == pytest.approx(fattree.closed_form(tree, algo, 4 << 20), rel=1e-6)


@needs_simgrid
@pytest.mark.timeout(60)
def test_oversubscribed_the_ring_in_order_is_unharmed_and_scattered_is_slower():
    tree, n = _tree(8, 4, 4), 4 << 20
    closed = fattree.closed_form(tree, "ring", n)
    order, _ = fattree.simulate(tree, "ring", n, fattree.placement("order", tree))
    scatter, _ = fattree.simulate(tree, "ring", n, fattree.placement("scatter", tree))
    assert order == pytest.approx(closed, rel=1e-6)
    # Four flows share each uplink of one host's rate: the bandwidth term four times over.
    assert scatter > 3 * closed
    assert scatter == pytest.approx(
        fattree.estimate(tree, fattree.placement("scatter", tree), "ring", n), rel=1e-6)


@needs_simgrid
@pytest.mark.timeout(60)
def test_the_command_writes_its_table(tmp_path):
    done = _study(tmp_path, "--ranks", "8", "--hosts-per-leaf", "4", "--sizes", "1M",
                  "--oversubscription", "1,2", "--placements", "order,scatter")
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "out" / "fattree.json").read_text())["rows"]
    assert [(r["oversubscription"], r["placement"]) for r in rows] == [
        (1, "order"), (1, "scatter"), (2, "order"), (2, "scatter")]
    assert rows[3]["ratio"] > 1.5 > rows[2]["ratio"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| 8 | 1 MiB | 2:1 | ring | scatter |" in summary
