"""The heartbeat compares collective counts of one process group only: pipeline stages enter
different numbers of data-parallel collectives, which must not make a healthy rank look hung."""

from __future__ import annotations

from zerotrain.comm.heartbeat import Heartbeat


class Store(dict):
    def set(self, key, value):
        self[key] = value.encode()

    def get(self, key):
        return self[key]


def test_a_subgroup_failure_names_only_a_member_that_is_behind(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    store = Store()
    beats = [Heartbeat(store, r, 4) for r in range(4)]
    for _ in range(3):  # ranks 0 and 2 share a group, 1 and 3 another; all in the world's
        for hb in beats:
            hb.count(None)
    for _ in range(5):
        beats[0].count((0, 2))
        beats[1].count((1, 3))
    for _ in range(4):
        beats[2].count((0, 2))  # rank 2 is one collective of its group behind rank 0
    for _ in range(2):
        beats[3].count((1, 3))
    calls = iter(range(10**6))

    def publish_all():  # every rank beats between the two reads: all alive
        for hb in beats:
            hb._beats = next(calls)
            hb._publish()

    publish_all()
    monkeypatch.setattr("time.sleep", lambda s: publish_all())
    ranks, why = beats[0].diagnose((0, 2))
    assert ranks == [2] and "rank 2 (at collective 4) is alive but never joined collective 5" in why
    # rank 3 is 3 collectives behind rank 1 in *its* group, which is not the one that failed
    assert beats[0].diagnose(None) == ([], "")  # the world's counts agree
