"""bench/plan_accuracy.py: for every config in configs/ and generated 1-, 4- and 8-camera pose
configs, `npucam plan`'s predicted NPU utilisation, results per second per model and detect
drop fraction are within 15% (absolute points for the fractions) of a paced sim run of the
same config on this machine: 60 s, lengthened where needed to measure whole loops of its
scene, at least two (multicam-3d: 118 s) (docs/benchmarks.md). Slow: ~15 minutes; its verdict
depends on the machine's load staying steady between each plan and its run (the bench
prints it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "plan_accuracy.py"


def _bench():
    spec = importlib.util.spec_from_file_location("plan_accuracy", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the whole bench, ~15 minutes (pyproject's 300 s would end it)
def test_plans_are_within_15_percent_of_paced_runs(tmp_path):
    out = tmp_path / "rows.json"
    assert _bench().main(["--duration", "60", "--json", str(out)]) == 0, out.read_text()


def test_the_comparison_applies_15_percent_to_rates_15_points_to_utilisation_5_to_drops():
    compare = _bench().compare

    def verdicts(pred: dict, meas: dict) -> dict[str, bool]:
        return {row[0]: row[4] for row in compare(pred, meas)}

    pred = {"npu": 1.0, "results": {"sapiens2": 0.40, "clip": 0.0}, "detect_drop": 0.30,
            "detect_ms": 40.0}  # fmt: skip
    near = {"npu": 0.86, "results": {"sapiens2": 0.46, "clip": 0.0}, "detect_drop": 0.26,
            "detect_ms": 46.0}  # fmt: skip
    far = {"npu": 0.84, "results": {"sapiens2": 0.48, "clip": 0.1}, "detect_drop": 0.24,
           "detect_ms": 47.5}  # fmt: skip
    # 14 points, 13%, 0 = 0, 4 points (issue 29's 5), 13%
    assert all(verdicts(pred, near).values())
    # 16 points, 17%, 0 vs 0.1, 6 points, 16%
    assert not any(verdicts(pred, far).values())


def test_every_pipeline_config_is_run(tmp_path):
    bench = _bench()
    (tmp_path / "configs").mkdir()
    configs = bench.copy_configs(tmp_path, None, [1])
    repo = Path(__file__).resolve().parents[2] / "configs"
    assert set(configs) == {p.stem for p in repo.glob("*.toml")} | {"pose-1cam"}
    assert "studio-3d" in configs and "studio-3d-multi" in configs


def test_a_runs_window_is_the_whole_loops_asked_for():
    bench = _bench()

    def stats(t: float) -> dict:  # a pose every 2.4 s and a busy device from t = 4 s
        done = {"published": int(t / 2.4), "batches": int(t / 2.4), "cost_estimate_seconds": 2.4}
        return {
            "uptime_s": t,
            "cameras": {},
            "stages": {
                "infer": {"gauges": {"device_busy_seconds": t}},
                "infer/sapiens2": {"gauges": done, "drops": {}},
            },
        }

    run = {"duration": 70.0, "stats": [stats(t) for t in range(4, 71, 2)]}
    whole = bench.measured(run, ["sapiens2"], 50.0)
    assert whole["window_s"] == 50.0  # from 14 s (infer up at 4, WARM_S 10) to 64 s
    assert whole["npu"] == 1.0 and abs(whole["results"]["sapiens2"] - 21 / 50) < 1e-9
    assert bench.measured(run, ["sapiens2"])["window_s"] == 54.0  # to the last before the end
