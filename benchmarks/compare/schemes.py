"""Compression settings (the ``compression`` value of a config's ``zeropp_hier`` section) that
both the link-bound benchmark and the convergence benchmark run, named once so that the speed
and the accuracy of a variant are measured on the same scheme. Each names every gradient hop,
so that a later change of ``frontier``'s default does not change what a recorded name ran."""

# int8 gradients on the in-package hop, int4 on the two hops that leave the package: the
# link-bound variant frontier/pipe-int8-gcd
INT8_GCD_GRADIENTS = {"gradients": {"gcd": "int8", "gpu": "int4", "node": "int4"}}
# the same with an int8 node hop: the variant frontier/pipe-int8-gcd-node8, frontier's default
# gradients since it was measured (CHANGELOG)
INT8_GCD_NODE8 = {"gradients": {"gcd": "int8", "gpu": "int4", "node": "int8"}}
# frontier's default gradients before that: exact inside the package, int4 over the package
# links, int8 over the network
EXACT_GCD_GRADIENTS = {"gradients": {"gcd": "none", "gpu": "int4", "node": "int8"}}
# int4 gradients on both hops that leave the package, exact inside it: frontier's default until
# its node stage became int8 (CHANGELOG); error feedback "auto", so on the node stage
INT4_NODE_GRADIENTS = {"gradients": {"gcd": "none", "gpu": "int4", "node": "int4"}}
