"""``patch_deepspeed`` / ``unpatch_deepspeed`` on the deepspeed module, without a world
(tests/dist/test_integrations.py trains through the patch)."""

import deepspeed

import zeropp_hier


def test_patch_is_idempotent_and_reversible():
    original = deepspeed.initialize
    try:
        zeropp_hier.patch_deepspeed()
        patched = deepspeed.initialize
        assert patched is not original and zeropp_hier.is_patched()
        zeropp_hier.patch_deepspeed()
        assert deepspeed.initialize is patched  # no wrapper around the wrapper
        zeropp_hier.unpatch_deepspeed()
        assert deepspeed.initialize is original and not zeropp_hier.is_patched()
        zeropp_hier.unpatch_deepspeed()
        assert deepspeed.initialize is original
    finally:
        if zeropp_hier.is_patched():
            zeropp_hier.unpatch_deepspeed()
