"""Retention (stages/record/retention.py): the oldest closed segments go first, never an open
one, the bytes held never pass max_bytes, closed segments past max_age_s go, and segments of
earlier sessions count and go before this run's."""

from __future__ import annotations

import os

from stages.record.retention import Retention, disk_free, existing_segments


def _files(tmp_path, name, size):
    path = tmp_path / name
    path.write_bytes(b"x" * size)
    return (path,)


def _write(retention, segment, n):
    assert retention.reserve(n)
    retention.settle(segment, n, n)


def test_the_oldest_closed_segments_are_deleted_first_to_make_room(tmp_path):
    r = Retention(max_bytes=1000, max_age_s=None)
    segs = []
    for i in range(3):
        s = r.open(_files(tmp_path, f"s{i}", 300))
        _write(r, s, 300)
        r.close(s)
        segs.append(s)
    current = r.open(_files(tmp_path, "s3", 0))
    assert r.reserve(250)  # 900 + 250 > 1000: s0 goes
    assert not segs[0].files[0].exists() and segs[1].files[0].exists()
    r.settle(current, 250, 250)
    assert r.used == 850 and r.deleted == 1


def test_an_open_segment_is_never_deleted_and_a_write_that_cannot_fit_is_refused(tmp_path):
    r = Retention(max_bytes=1000, max_age_s=None)
    a = r.open(_files(tmp_path, "a", 0))
    _write(r, a, 900)
    assert not r.reserve(200)  # nothing closed to delete
    assert a.files[0].exists() and r.used == 900


def test_reserved_bytes_count_until_settled_so_two_writers_never_overshoot(tmp_path):
    r = Retention(max_bytes=1000, max_age_s=None)
    r.open(_files(tmp_path, "a", 0))
    assert r.reserve(600)
    assert not r.reserve(600)  # the first write has not settled: its 600 still count
    assert r.used == 600


def test_closed_segments_older_than_max_age_are_deleted(tmp_path):
    now = [10_000_000_000]
    r = Retention(max_bytes=10**6, max_age_s=2.0, clock_ns=lambda: now[0])
    old = r.open(_files(tmp_path, "old", 10))
    r.close(old)
    now[0] += 1_500_000_000
    young = r.open(_files(tmp_path, "young", 10))
    r.close(young)
    r.expire()
    assert old.files[0].exists()  # 1.5 s old
    now[0] += 1_000_000_000
    r.expire()
    assert not old.files[0].exists() and young.files[0].exists()  # 2.5 s and 1.0 s


def test_segments_of_earlier_sessions_are_adopted_and_deleted_first(tmp_path):
    for session, stamp in (("s1", 100), ("s2", 200)):
        frames = tmp_path / session / "frames" / "cam"
        frames.mkdir(parents=True)
        for suffix in (".mjpeg", ".csv"):
            path = frames / f"000001{suffix}"
            path.write_bytes(b"y" * 100)
            os.utime(path, ns=(stamp * 10**9, stamp * 10**9))
    clip = tmp_path / "s2" / "clips" / "000001-cam"
    clip.mkdir(parents=True)
    for suffix in (".mjpeg", ".csv"):
        (clip / f"000001{suffix}").write_bytes(b"c" * 10)
        os.utime(clip / f"000001{suffix}", ns=(300 * 10**9, 300 * 10**9))
    (tmp_path / "s2" / "messages").mkdir()
    (tmp_path / "s2" / "messages" / "000001.msgs").write_bytes(b"z" * 50)
    found = existing_segments(tmp_path, (".mjpeg", ".csv"), ".msgs")
    assert sorted(s.bytes for s in found) == [20, 50, 200, 200]
    assert found[0].files[0].parts[-4] == "s1"
    r = Retention(max_bytes=520, max_age_s=None)
    r.adopt(found)
    mine = r.open(_files(tmp_path, "mine", 0))
    assert r.reserve(100)  # 470 + 100: s1's frame segment goes
    r.settle(mine, 100, 100)
    assert not (tmp_path / "s1" / "frames" / "cam" / "000001.mjpeg").exists()
    assert (tmp_path / "s2" / "frames" / "cam" / "000001.mjpeg").exists()


def test_the_oldest_closed_segments_go_to_keep_min_free_bytes_free_on_the_disk(tmp_path):
    capacity = 2000  # a disk of 2000 bytes holding only these files

    def free():
        return capacity - sum(p.stat().st_size for p in tmp_path.iterdir())

    r = Retention(max_bytes=10**6, max_age_s=None, min_free_bytes=500, free_bytes=free)
    segs = []
    for i in range(3):
        s = r.open(_files(tmp_path, f"s{i}", 400))
        _write(r, s, 400)
        r.close(s)
        segs.append(s)
    assert r.reserve(300)  # 800 free - 300 < 500: s0 goes, then 1200 - 300 >= 500
    assert [s.files[0].exists() for s in segs] == [False, True, True]
    r.settle(None, 300, 0)
    assert not r.reserve(1600)  # even with s1 and s2 gone: 2000 - 1600 < 500
    assert not any(s.files[0].exists() for s in segs[1:])


def test_disk_free_reads_the_filesystem_of_the_nearest_existing_folder(tmp_path):
    free = disk_free(tmp_path / "not" / "made" / "yet")
    st = os.statvfs(tmp_path)
    assert abs(free() - st.f_bavail * st.f_frsize) < 1 << 30  # the same filesystem, moments apart
