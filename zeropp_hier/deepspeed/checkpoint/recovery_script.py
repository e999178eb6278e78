"""The ``zero_to_fp32.py`` / ``zero_to_torch.py`` beside a checkpoint's tags, replaced.

DeepSpeed's ``save_checkpoint`` copies its own two scripts into the checkpoint directory; they
load every file with ``torch.load(weights_only=False)``, so running them on a checkpoint whose
files someone else could write runs whatever code a file names ([Note: tensors-only loading]
in checkpoint/safe_load.py). Rank 0 overwrites both, after DeepSpeed's save, with a script of the same
name and arguments that runs the verified, tensors-only consolidation
(``zeropp_hier.tools.export_hf.fp32_script_main``) and says where the Hugging Face export is.
"""

from __future__ import annotations

import os

SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")

TEXT = '''#!/usr/bin/env python
"""Consolidated fp32 weights of this directory's checkpoints, written by zeropp-hier in place of
DeepSpeed's script of this name (which loads the files with pickle, so a tampered file could run
code). This one verifies the tag against its MANIFEST and reads tensors only:

    python {name} CHECKPOINT_DIR OUTPUT_DIR [-t TAG]      # safetensors, the engine's names

A Hugging Face model directory (config.json + safetensors, from_pretrained loads it):

    zeropp-hier checkpoint export-hf CHECKPOINT_DIR/TAG --out DIR
"""
import sys

from zeropp_hier.tools.export_hf import fp32_script_main

if __name__ == "__main__":
    sys.exit(fp32_script_main(sys.argv[1:]))
'''


def replace_scripts(save_dir: str) -> None:
    """Overwrite DeepSpeed's recovery scripts in ``save_dir`` (where they exist)."""
    for name in SCRIPTS:
        path = os.path.join(save_dir, name)
        if not os.path.isfile(path):
            continue
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(TEXT.format(name=name))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
