"""Cross-view association and rig person ids (stages/rig/associate.py), on the scenes of
test_triangulate.py: bodies of one template shape (so only geometry tells them apart), 1 px
noise, one view per keypoint occluded or moved, people shuffled in every camera.
"""

from __future__ import annotations

import numpy as np
import pytest
from rig_scenes import corrupt, observe, people, ring_cameras

from stages.rig.associate import AssociationError, RigPersonIds, associate, pair_costs


def shuffled_scene(seed: int, n_people: int):
    rng = np.random.default_rng(seed)
    cams = ring_cameras(rng)
    truth = people(rng, n_people)
    seen, _, _ = corrupt(observe(cams, truth, rng), rng)
    orders = [rng.permutation(n_people) for _ in cams]  # camera v's person i is orders[v][i]
    per_camera = [seen[v][order] for v, order in enumerate(orders)]
    return cams, truth, per_camera, orders


@pytest.mark.parametrize(("n_people", "seed"), [(1, 21), (2, 22), (3, 23), (3, 24)])
def test_every_view_goes_to_its_person(n_people, seed):
    cams, _, per_camera, orders = shuffled_scene(seed, n_people)
    clusters = associate(cams, per_camera)
    assert len(clusters) == n_people
    for cluster in clusters:
        assert sorted(cluster) == [0, 1, 2, 3]
        assert len({int(orders[v][i]) for v, i in cluster.items()}) == 1, cluster


def test_pair_cost_separates_the_same_person_from_another():
    cams, _, per_camera, orders = shuffled_scene(25, 3)
    cost = pair_costs(cams[0], cams[1], per_camera[0], per_camera[1])
    same = orders[0][:, None] == orders[1][None, :]
    assert (cost[same] < 3).all()  # px: ~1 px noise, the moved views outvoted by the median
    assert (cost[~same] > 20).all()


def test_a_person_missing_from_one_camera_keeps_the_others():
    cams, _, per_camera, orders = shuffled_scene(26, 3)
    gone = int(np.flatnonzero(orders[2] == 1)[0])
    per_camera[2] = np.delete(per_camera[2], gone, axis=0)
    orders[2] = np.delete(orders[2], gone)
    views = {}
    for cluster in associate(cams, per_camera):
        v, i = next(iter(cluster.items()))
        views[int(orders[v][i])] = sorted(cluster)
    assert views == {0: [0, 1, 2, 3], 1: [0, 1, 3], 2: [0, 1, 2, 3]}


def test_a_person_seen_by_one_camera_forms_no_cluster():
    cams, _, per_camera, _ = shuffled_scene(27, 2)
    lone = per_camera[0][:1]
    assert associate(cams, [lone] + [p[:0] for p in per_camera[1:]]) == []


def test_rig_ids_persist_with_tracks_and_survive_a_track_change():
    cams, _, per_camera, orders = shuffled_scene(28, 3)
    clusters = associate(cams, per_camera)
    person_of = [{v: int(orders[v][i]) for v, i in c.items()} for c in clusters]
    # camera v's 2D track id of true person p: 100 v + p
    tracks = [[100 * v + int(p) for p in order] for v, order in enumerate(orders)]
    ids = RigPersonIds()
    first = ids.update(clusters, tracks)
    assert sorted(first) == [0, 1, 2]
    rig_of = {next(iter(p.values())): rid for p, rid in zip(person_of, first, strict=True)}
    assert ids.update(clusters, tracks) == first  # same tracks, same ids
    # camera 1's tracker renumbers everyone; the other three cameras keep the ids
    renumbered = [list(t) for t in tracks]
    renumbered[1] = [t + 50 for t in tracks[1]]
    assert ids.update(clusters, renumbered) == first
    # true person 2 leaves and a new person takes new tracks in every camera: a new id
    fresh = [list(t) for t in renumbered]
    for v, order in enumerate(orders):
        fresh[v][int(np.flatnonzero(order == 2)[0])] += 1000
    again = ids.update(clusters, fresh)
    for p, rid in zip(person_of, again, strict=True):
        truth = next(iter(p.values()))
        assert (rid == rig_of[truth]) == (truth != 2)
    assert max(again) == 3


def test_a_person_association_split_in_two_is_joined_under_its_id():
    # views 0-3, two people; track ids: person 0 is track 0 in every view, person 1 track 1
    tracks = [[0, 1]] * 4
    ids = RigPersonIds()
    whole = [{0: 0, 1: 0, 2: 0, 3: 0}, {0: 1, 1: 1, 2: 1, 3: 1}]
    assert ids.update(ids.merge(whole, tracks), tracks) == [0, 1]
    # one pair of person 0's views disagreed: association made two clusters of it
    split = [{0: 0, 3: 0}, {0: 1, 1: 1, 2: 1, 3: 1}, {1: 0, 2: 0}]
    merged = ids.merge(split, tracks)
    assert merged == whole
    assert ids.update(merged, tracks) == [0, 1]
    # a cluster whose members had different ids is joined to nothing
    mixed = [{0: 0, 1: 1}, {2: 0, 3: 0}]
    assert ids.merge(mixed, tracks) == mixed


def test_people_arrays_of_the_wrong_shape_name_the_camera():
    cams = ring_cameras(np.random.default_rng(1))
    people_arrays = [np.zeros((1, 308, 3))] * 3 + [np.zeros((1, 17, 3))]
    with pytest.raises(AssociationError, match="camera 'cam3': people must be"):
        associate(cams, people_arrays)
    with pytest.raises(AssociationError, match="3 people arrays for 4 cameras"):
        associate(cams, people_arrays[:3])
    with pytest.raises(AssociationError, match="camera 'cam1': 65 people, at most 64"):
        associate(cams, [np.zeros((1, 5, 3)), np.zeros((65, 5, 3))] + [np.zeros((0, 5, 3))] * 2)
