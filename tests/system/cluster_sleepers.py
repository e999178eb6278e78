"""A driver for tests/system/test_cluster.py (``python -m tests.system.cluster_sleepers PREFIX``
from the repository root): build a small emulated cluster, start sleeping processes inside it
(ranks with PR_SET_PDEATHSIG, and one detached process that outlives its launcher), print their
pids, then wait to be killed."""

import subprocess
import sys
import time

from benchmarks.cluster.runner import Cluster, launch
from benchmarks.cluster.spec import ClusterSpec


def main() -> None:
    spec = ClusterSpec.scaled(prefix=sys.argv[1], nodes=2, gpus_per_node=1, gcds_per_gpu=2)
    with Cluster(spec):
        ranks = launch(spec, ["-c", "import time; time.sleep(600)"])
        # not our child once its launcher exits, no death signal: only teardown can end it
        detached = subprocess.Popen(
            ["ip", "netns", "exec", spec.package_ns(1, 0), "sleep", "600"], start_new_session=True
        )
        print("READY " + " ".join(str(p.pid) for p in ranks + [detached]), flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()
