"""tools/bench_propagation.py --paired: nvshard and GSPMD timed back to back
on one program. JAX is stood in for by fixed replies, so the test checks
the rounds' order and arithmetic, not the machine."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
try:
    import bench_propagation as bp
finally:
    sys.path.pop(0)


def test_paired_rounds_swap_order_and_report_ratios(monkeypatch, capsys):
    calls = []
    replies = iter([0.002, 0.004, 0.001])  # GSPMD propagation per round; partitioning adds as much again
    monkeypatch.setattr(bp.bench_jax, "available", lambda kind: True)
    monkeypatch.setattr(bp.bench_jax, "close", lambda kind=None: None)

    def jax_times(key, mesh, sizes, repeats):
        calls.append("jax")
        prop = next(replies)
        return {"gspmd": {"propagation_s": prop, "prop_partition_s": 2 * prop}}

    def nvshard_passes(fusion, shapes, repeats, clock):
        calls.append("nvshard")
        return 0.002, 0.0

    monkeypatch.setattr(bp.bench_jax, "time_passes", jax_times)
    monkeypatch.setattr(bp, "time_passes", nvshard_passes)
    monkeypatch.setattr(bp, "time_build", lambda fusion, shapes, mode, repeats, clock: 0.003)
    assert bp.main(["--paired", "MLP SP", "1", "3"]) == 0
    assert calls == ["nvshard", "jax", "jax", "nvshard", "nvshard", "jax"]
    out = capsys.readouterr().out
    assert "| 1 | nvshard first | 2.0 | 2.0 | 1.00 | 3.0 | 4.0 | 0.75 |" in out
    assert "| 2 | GSPMD first | 2.0 | 4.0 | 0.50 | 3.0 | 8.0 | 0.38 |" in out
    assert "| 3 | nvshard first | 2.0 | 1.0 | 2.00 | 3.0 | 2.0 | 1.50 |" in out
    assert ("median of the rounds' ratios: propagation 1.00, full plan 0.75; least disturbed rounds: "
            "propagation 2.0 vs 1.0 ms (2.00), full plan 3.0 vs 2.0 ms (1.50)") in out


def test_paired_without_jax_says_so(monkeypatch, capsys):
    monkeypatch.setattr(bp.bench_jax, "available", lambda kind: False)
    assert bp.main(["--paired", "MLP SP", "1", "1"]) == 1
    assert "--paired needs jax" in capsys.readouterr().err
