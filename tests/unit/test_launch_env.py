"""The launcher's variables are checked before anything reads them as numbers
(zeropp_hier/detect/launch_env.py); a local check agreed without a world raises its own error
(zeropp_hier/comm/agree.py, the path of a single process)."""

import pytest

from zeropp_hier.comm.agree import agree_local
from zeropp_hier.core.errors import HierTopologyError
from zeropp_hier.detect.autodetect import local_record
from zeropp_hier.detect.launch_env import check_launch_env


@pytest.mark.parametrize(
    "env, name",
    [
        ({"LOCAL_RANK": "abc"}, "LOCAL_RANK"),
        ({"LOCAL_RANK": "²"}, "LOCAL_RANK"),  # a digit to str.isdigit, not to int()
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK"),
        ({"WORLD_SIZE": "8x"}, "WORLD_SIZE"),
        ({"RANK": "8", "WORLD_SIZE": "8"}, "RANK"),
        ({"RANK": "1.0"}, "RANK"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "two"}, "SLURM_NTASKS"),
    ],
)
def test_unusable_launch_variables_are_named(env, name):
    with pytest.raises(HierTopologyError, match=f"at '{name}'"):
        check_launch_env(env)


def test_usable_launch_variables_pass():
    check_launch_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": " 3 ", "LOCAL_WORLD_SIZE": "8"})
    check_launch_env({})


def test_auto_topology_names_a_bad_local_rank():
    with pytest.raises(HierTopologyError, match="at 'LOCAL_RANK': got 'abc'"):
        local_record(1, {"LOCAL_RANK": "abc"}, "host", 0, None)


def test_agree_local_without_a_world_raises_the_checks_own_error():
    def bad():
        raise HierTopologyError("LOCAL_RANK", "abc", "set it")

    with pytest.raises(HierTopologyError, match="LOCAL_RANK"):
        agree_local("the launch environment", bad)
    assert agree_local("a passing check", lambda: 7) == 7
