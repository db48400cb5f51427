""".ci/no_host_speed_asserts.py (the lint `make lint` runs): it fails on a default-run test
that bounds a wall-clock duration by a constant, lets a slow test, a marked hang guard and the
order of two clock reads pass, and passes on the repository's tests/ as committed."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "no_host_speed_asserts.py"


def _lint():
    spec = importlib.util.spec_from_file_location("no_host_speed_asserts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _findings(tmp_path: Path, source: str) -> list[str]:
    path = tmp_path / "test_sample.py"
    path.write_text(textwrap.dedent(source))
    return _lint().check_file(path)


def test_a_duration_bounded_by_a_constant_fails(tmp_path):
    found = _findings(
        tmp_path,
        """
        import time

        def test_fast():
            t0 = time.perf_counter()
            work()
            elapsed = time.perf_counter() - t0
            assert elapsed < 0.5
        """,
    )
    assert len(found) == 1 and found[0].endswith(":8: wall-clock bound in a default-run "
                                                 "test: assert elapsed < 0.5")  # fmt: skip


def test_a_rate_from_a_clock_read_and_a_bare_monotonic_fail(tmp_path):
    found = _findings(
        tmp_path,
        """
        import time
        from time import monotonic

        def test_rate():
            t0 = time.monotonic()
            n = count()
            rate = n / (time.monotonic() - t0)
            assert rate >= 25.0

        def test_prompt():
            start = monotonic()
            stop()
            assert 0.5 > monotonic() - start
        """,
    )
    assert [f.split(":")[1] for f in found] == ["9", "14"]


def test_slow_tests_marked_guards_and_stamp_order_pass(tmp_path):
    found = _findings(
        tmp_path,
        """
        import time
        import pytest

        @pytest.mark.slow
        def test_rate_against_a_control():
            t0 = time.perf_counter()
            assert time.perf_counter() - t0 < 0.5

        def test_hang_guard():
            t0 = time.monotonic()
            # wall-clock-ok: a hang guard, the alternative is a 3600 s deadline
            assert time.monotonic() - t0 < 60

        def test_order():
            a = time.perf_counter()
            b = time.perf_counter()
            assert a <= b
        """,
    )
    assert found == []


def test_a_slow_module_is_skipped(tmp_path):
    found = _findings(
        tmp_path,
        """
        import time
        import pytest

        pytestmark = pytest.mark.slow

        def test_anything():
            assert time.time() < 5
        """,
    )
    assert found == []


def test_a_bound_in_a_helper_on_stamps_passed_in_fails(tmp_path):
    """The camera-fault test's old assert_unaffected: the test takes now_ns() stamps, a helper
    compares a silence and a rate built from them and the recorder's arrival stamps to named
    constants, and the recovery time comes back through asyncio.run(main()) as a tuple."""
    found = _findings(
        tmp_path,
        """
        import asyncio
        from pipeline.messages import now_ns

        FPS, RATE_SHARE, MAX_GAP_S, BOUND_S = 25.0, 0.7, 1.0, 2.8

        def unaffected(rec, t0_ns, t1_ns):
            times = [s.received_ns for s in rec.frames() if t0_ns <= s.received_ns <= t1_ns]
            span = (t1_ns - t0_ns) / 1e9
            assert len(times) >= RATE_SHARE * FPS * span - 1
            edges = [t0_ns, *times, t1_ns]
            gap = max(b - a for a, b in zip(edges, edges[1:]))
            assert gap <= MAX_GAP_S

        def recovered(rec, back_ns):
            return (rec.first().header["publish_ts"] - back_ns) / 1e9

        def test_fault(rec):
            async def main():
                t_fault = now_ns()
                seconds = recovered(rec, now_ns())
                unaffected(rec, t_fault, now_ns())
                return seconds, rec.count()

            recovery, count = asyncio.run(main())
            assert 0 < recovery <= BOUND_S
            assert count >= 2
        """,
    )
    assert [f.split(":")[1] for f in found] == ["10", "13", "26"]


def test_counts_over_a_fixed_sleep_fail_and_happened_at_all_passes(tmp_path):
    found = _findings(
        tmp_path,
        """
        import asyncio
        import time

        def test_rate(rec):
            before = len(rec.frames)
            time.sleep(0.5)
            assert len(rec.frames) >= before + 20
            assert len(rec.frames) > before
            assert rec.bad >= 1

        async def test_async_rate(rec):
            await asyncio.sleep(2.0)
            assert 8 <= len(rec.previews) <= 22
        """,
    )
    assert [f.split(":")[1] for f in found] == ["8", "14"]
    assert "count over a fixed sleep" in found[0]


def test_stamps_gathered_in_a_list_and_a_helpers_result_in_an_assert_fail(tmp_path):
    found = _findings(
        tmp_path,
        """
        import asyncio
        import time

        def test_gaps(rec):
            gaps = []
            for a, b in rec.pairs():
                gaps.append(b.received_ns - a.received_ns)
            assert max(gaps) < 1.0

        def test_wait():
            async def main():
                t0 = time.perf_counter()
                await work()
                return time.perf_counter() - t0

            assert asyncio.run(main()) < 0.5
        """,
    )
    assert [f.split(":")[1] for f in found] == ["9", "17"]


def test_a_sleep_in_a_poll_loop_is_a_wait_not_a_window(tmp_path):
    found = _findings(
        tmp_path,
        """
        import time

        def test_polled(model):
            while len(model.items) < 3:
                time.sleep(0.01)
            assert len(model.items) >= 3
        """,
    )
    assert found == []


def test_values_stamped_or_filtered_by_the_clock_are_not_times(tmp_path):
    """A frame made with a now_ns() stamp, stats chosen by their publish time, a count of
    stamps and the order of a stamp and a clock read are behaviour."""
    found = _findings(
        tmp_path,
        """
        from pipeline.messages import now_ns

        def stats_after(rec, after_ns):
            return [s.stats for s in rec.stats() if s.header["publish_ts"] > after_ns]

        def test_values(stage, rec, frame):
            t0 = now_ns()
            det = stage.process(frame(now_ns()))
            assert 150 < det.box[0] < 300
            assert stats_after(rec, t0)[-1]["reconnects"] >= 2
            times = [s.received_ns for s in rec.frames()]
            assert len(times) >= 10
            assert t0 <= det.capture_ts_ns
        """,
    )
    assert found == []


def test_the_committed_tests_pass():
    lint = _lint()
    assert lint.main([str(REPO / "tests")]) == 0
