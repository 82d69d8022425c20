"""``algo="auto"``: the choice from a profile (no MPI needed)."""

import pytest

from hpctrain.collectives import auto
from hpctrain.errors import UsageError

PARAMS = {"fitted": {"alpha": 2e-6, "beta": 1e-9, "gamma": 1e-10},
          "p2p_prior": {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10},
          "switch_bytes": 65536,
          "measured_best": {"2": [[8, "mpi"], [4096, "butterfly"], [1048576, "ring"]]}}


def test_measured_winner_at_the_nearest_size_in_log_scale():
    profile = auto.Profile.from_dict(PARAMS)
    assert profile.choose(8, 2) == "mpi"
    assert profile.choose(100, 2) == "mpi"          # log2: 6.6 is nearer 3 than 12
    assert profile.choose(1000, 2) == "butterfly"
    assert profile.choose(60000, 2) == "butterfly"  # 15.9 vs 12 and 20
    assert profile.choose(100000, 2) == "ring"
    assert profile.choose(1 << 30, 2) == "ring"     # beyond the range: the largest


def test_unmeasured_rank_counts_follow_the_model():
    profile = auto.Profile.from_dict(PARAMS)
    # Small messages: latency dominates; the butterfly's lg p messages beat the ring's
    # 2(p-1). Large ones: bytes dominate; at p = 48 the butterfly folds 16 ranks in and out
    # (2n more bytes) and the tree sends 2n lg p, so the ring's 2n(p-1)/p wins.
    assert profile.choose(8, 48) == "butterfly"
    assert profile.choose(256 << 20, 48) == "ring"


def test_a_degenerate_fit_falls_back_to_the_ping_pong_parameters():
    zero = {**PARAMS, "fitted": {"alpha": 0.0, "beta": 0.0, "gamma": 0.0}}
    assert auto.Profile.from_dict(zero).params.alpha == 1e-6
    # Latency only, no cost per byte: every size would take the same time, so the
    # algorithm with the fewest messages would win at 1 GiB. Also degenerate.
    latency_only = {**PARAMS, "fitted": {"alpha": 5e-6, "beta": 0.0, "gamma": 0.0}}
    assert (auto.Profile.from_dict(latency_only).params.alpha,
            auto.Profile.from_dict(latency_only).params.beta) == (1e-6, 1e-9)
    assert auto.Profile.from_dict(latency_only).choose(256 << 20, 48) == "ring"
    # One per-byte cost is enough to keep the fit.
    no_gamma = {**PARAMS, "fitted": {"alpha": 5e-6, "beta": 1e-9, "gamma": 0.0}}
    assert auto.Profile.from_dict(no_gamma).params.alpha == 5e-6


def test_measured_best_skips_horovod_auto_and_wrong_rows():
    rows = [{"np": 2, "size": 8, "algo": "ring", "time_median_us": 9.0, "wrong": 0},
            {"np": 2, "size": 8, "algo": "horovod", "time_median_us": 1.0, "wrong": 0},
            {"np": 2, "size": 8, "algo": "auto", "time_median_us": 1.0, "wrong": 0},
            {"np": 2, "size": 8, "algo": "tree", "time_median_us": 2.0, "wrong": 3},
            {"np": 2, "size": 8, "algo": "mpi", "time_median_us": 5.0, "wrong": 0},
            {"np": 3, "size": 64, "algo": "ring", "time_median_us": 7.0, "wrong": 0}]
    assert auto.measured_best(rows) == {"2": [[8, "mpi"]], "3": [[64, "ring"]]}


def test_a_file_that_is_no_profile_is_named():
    with pytest.raises(UsageError, match="bad.json is not an allreduce profile"):
        auto.Profile.from_dict({"rows": []}, "bad.json")
