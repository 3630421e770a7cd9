"""bench.run's --rounds summary: per-round ratios, medians, and the goal judged on them."""

from __future__ import annotations

from bench.run import summarize


def _round(nginx_cpu: float, sidecar_cpu: float, complete: bool = True, itl_p99: float = 0.1) -> dict:
    sidecar = {
        "proxy_cpu_us_per_token": sidecar_cpu,
        "complete": complete,
        "unbuffered": True,
        "added_itl_ms": {"p50": 0.0, "p99": itl_p99},
        "added_ttft_ms": {"p50": 0.0, "p99": 0.5},
        "peak_rss_mb": 60.0,
    }
    return {
        "streams": 200,
        "targets": {"direct": {}, "nginx": {"proxy_cpu_us_per_token": nginx_cpu}, "sidecar": sidecar},
        "ratios": {"sidecar_vs_nginx_cpu_per_token": sidecar_cpu / nginx_cpu},
    }


def test_the_goal_is_judged_on_the_median_of_per_round_ratios():
    # Ratios 2.0, 3.0, 2.4: one bad round does not decide, the median (2.4) does.
    rounds = [_round(4.0, 8.0), _round(3.0, 9.0), _round(5.0, 12.0)]
    summary = summarize(rounds)
    assert summary["rounds"] == 3
    stats = summary["ratios"]["sidecar_vs_nginx_cpu_per_token"]
    assert (stats["median"], stats["min"], stats["max"]) == (2.4, 2.0, 3.0)
    assert summary["cpu_us_per_token"]["sidecar"]["median"] == 9.0
    assert summary["goal"]["cpu_per_token<=2.5x_nginx"] is True


def test_a_median_over_the_goal_misses_and_any_incomplete_round_fails():
    rounds = [_round(4.0, 12.0), _round(3.0, 9.0, complete=False), _round(5.0, 11.0)]
    goal = summarize(rounds)["goal"]
    assert goal["cpu_per_token<=2.5x_nginx"] is False  # ratios 3.0, 3.0, 2.2
    assert goal["complete_and_unbuffered"] is False


def test_latency_checks_use_the_median_round():
    rounds = [_round(4.0, 8.0, itl_p99=5.0), _round(4.0, 8.0, itl_p99=0.2), _round(4.0, 8.0, itl_p99=0.3)]
    assert summarize(rounds)["goal"]["added_itl_p99_ms<=1"] is True
