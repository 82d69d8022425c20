"""The one stall rule (hpctrain/stalls.py) that the engine and the watchdog apply."""

from hpctrain.stalls import StallRule, stalled


def test_a_wait_is_warned_about_once_until_it_settles():
    rule = StallRule(warn_s=10)
    assert [rule.warn("a", w) for w in (9.9, 10, 30)] == [False, True, False]
    assert rule.warn("b", 10)               # another wait has its own warning
    rule.settled("a")
    assert rule.warn("a", 12)               # the same name, waiting again


def test_giving_up_is_stateless_so_ranks_with_the_same_clock_agree():
    rule = StallRule(warn_s=1, give_up_s=5)
    assert [rule.give_up(w) for w in (4.9, 5, 5, 7)] == [False, True, True, True]


def test_zero_or_none_means_never():
    for never in (0, None):
        rule = StallRule(warn_s=never, give_up_s=never)
        assert not rule.warn("a", 1e9) and not rule.give_up(1e9)


def test_one_wording_for_both_watchers():
    assert stalled("'allreduce.w'", 61.4, [3, 1], "asked for it") == \
        "stall: 'allreduce.w' has waited 61 s for rank(s) [1, 3], which have not asked for it"
