"""The suite's xdist groups ([Note: two lanes at once] in tests/lanes.py): one group for the dist
lane, one per module elsewhere, set only where tests are handed out by group."""

from pathlib import Path
from types import SimpleNamespace

from tests import lanes

TESTS = Path(__file__).resolve().parents[1]


class _Item:
    def __init__(self, path: Path):
        self.path, self.marks = path, []

    def add_marker(self, mark):
        self.marks.append(mark)


def _items():
    return [
        _Item(TESTS / "dist" / "test_parity.py"),
        _Item(TESTS / "dist" / "test_soak.py"),
        _Item(TESTS / "system" / "test_slurm.py"),
        _Item(TESTS / "unit" / "test_docs.py"),
        _Item(TESTS / "unit" / "test_docs.py"),
    ]


def test_the_dist_lane_is_one_group_and_every_other_module_its_own():
    items = _items()
    lanes.xdist_groups(SimpleNamespace(option=SimpleNamespace(loadgroup=True)), items)
    groups = [[m.args[0] for m in it.marks if m.name == "xdist_group"] for it in items]
    assert groups == [["dist"], ["dist"], ["system/test_slurm"], ["unit/test_docs"], ["unit/test_docs"]]


def test_no_groups_unless_tests_are_handed_out_by_group():
    items = _items()
    lanes.xdist_groups(SimpleNamespace(option=SimpleNamespace(loadgroup=False)), items)
    assert all(not it.marks for it in items)


def test_a_plain_dash_n_hands_out_groups_in_collection_order_and_an_explicit_dist_is_kept():
    plain = SimpleNamespace(option=SimpleNamespace(numprocesses=2, dist="no", loadscopereorder=True))
    lanes.xdist_schedule(plain)
    assert (plain.option.dist, plain.option.loadscopereorder) == ("loadgroup", False)
    explicit = SimpleNamespace(option=SimpleNamespace(numprocesses=2, dist="load", loadscopereorder=True))
    lanes.xdist_schedule(explicit)
    assert (explicit.option.dist, explicit.option.loadscopereorder) == ("load", True)
    serial = SimpleNamespace(option=SimpleNamespace(numprocesses=None, dist="no", loadscopereorder=True))
    lanes.xdist_schedule(serial)
    assert serial.option.dist == "no"
    # the workers are told, and take it up at configure
    node = SimpleNamespace(config=plain, workerinput={})
    lanes.xdist_node(node)
    worker = SimpleNamespace(workerinput=node.workerinput, option=SimpleNamespace(loadgroup=False))
    lanes.xdist_worker(worker)
    assert worker.option.loadgroup is True
