from mcp_scheduler.hot_copies import HotCopies
from mcp_scheduler.view import ClusterView, Demand, ModelSpecDoc

SPEC = {"m": ModelSpecDoc("m", ("1",), replicas=1, max_replicas=3)}


def view(now, *demand):
    return ClusterView(now=now, specs=SPEC, demand={"m": tuple(demand)} if demand else {})


def test_each_new_overflow_report_adds_one_copy_up_to_max():
    hot = HotCopies(quiet_period_s=60)
    assert hot.update(view(0)) == {}
    assert hot.update(view(1, Demand("m", "r1", overflow=5, at=1))) == {"m": 1}
    assert hot.update(view(2, Demand("m", "r1", overflow=5, at=1))) == {"m": 1}  # same report: no change
    assert hot.update(view(3, Demand("m", "r1", overflow=2, at=3))) == {"m": 2}
    assert hot.update(view(4, Demand("m", "r1", overflow=2, at=4))) == {"m": 2}  # max_replicas 3 = 1 + 2


def test_quiet_period_removes_one_copy_at_a_time():
    hot = HotCopies(quiet_period_s=10)
    hot.update(view(0, Demand("m", "r1", overflow=1, at=0)))
    hot.update(view(1, Demand("m", "r1", overflow=1, at=1)))
    assert hot.update(view(5)) == {"m": 2}
    assert hot.update(view(11)) == {"m": 1}
    assert hot.update(view(15)) == {"m": 1}
    assert hot.update(view(21)) == {}


def test_no_extra_copies_without_headroom_or_spec():
    hot = HotCopies(quiet_period_s=10)
    flat = {"m": ModelSpecDoc("m", ("1",), replicas=2, max_replicas=0)}
    assert (
        hot.update(ClusterView(now=1, specs=flat, demand={"m": (Demand("m", "r", overflow=9, at=1),)})) == {}
    )
    hot.update(view(1, Demand("m", "r1", overflow=1, at=1)))
    assert hot.update(ClusterView(now=2)) == {}


def test_a_router_whose_clock_is_behind_still_adds_copies():
    """Each router's report times are compared only with its own: r2's clock runs 60 s behind r1's."""
    hot = HotCopies(quiet_period_s=600)
    assert hot.update(view(1, Demand("m", "r1", overflow=1, at=1000.0))) == {"m": 1}
    ahead, behind = Demand("m", "r1", overflow=1, at=1000.0), Demand("m", "r2", overflow=1, at=940.0)
    assert hot.update(view(2, ahead, behind)) == {"m": 2}  # r2's report is new, though "older"


def test_copies_move_between_min_and_max_replicas():
    """replicas 3, min 1, max 4: one more on overflow, then quiet periods take it down to 1, never below."""
    specs = {"m": ModelSpecDoc("m", ("1",), replicas=3, min_replicas=1, max_replicas=4)}
    hot = HotCopies(quiet_period_s=10)

    def at(now, *demand):
        return hot.update(ClusterView(now=now, specs=specs, demand={"m": tuple(demand)} if demand else {}))

    assert at(0) == {}  # starts at replicas
    assert at(1, Demand("m", "r1", overflow=1, at=1)) == {"m": 1}  # 4
    assert at(2, Demand("m", "r1", overflow=1, at=2)) == {"m": 1}  # capped at max_replicas
    assert at(12) == {}  # quiet: back to 3
    assert at(22) == {"m": -1}  # 2
    assert at(32) == {"m": -2}  # 1 = min_replicas
    assert at(60) == {"m": -2}  # never below
    assert at(61, Demand("m", "r1", overflow=1, at=61)) == {"m": -1}  # hot again: grows back
