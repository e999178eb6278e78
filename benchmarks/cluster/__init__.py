"""An emulated three-tier cluster on one machine (network namespaces, veth, tc tbf).

    sudo python -m benchmarks.cluster setup      # build it (2 nodes x 2 packages x 2 GCDs)
    sudo python -m benchmarks.cluster status     # namespaces, qdiscs, counters
    sudo python -m benchmarks.cluster teardown   # remove everything it made (and nothing else)

``spec`` is the pure description, ``netns`` the side effects, ``runner`` the rank launcher.
It measures nothing itself and writes no result files: benchmarks/compare/ runs on it (its
``run`` and ``wire_links`` record ``benchmarks/results/compare*.json`` and ``wire_links_*.json``).
"""
