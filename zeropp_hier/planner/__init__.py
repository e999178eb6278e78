"""The planner: predicts one training step (time per phase and tier, memory per GCD) of every
layout and compression before any process starts, and ranks them. Pure arithmetic over ``core``
(no torch.distributed, no DeepSpeed, no printing, no files): ``model`` is the cost and memory
model and the ranking, ``tables`` the plain-text tables that the job and the command print.
The ``zeropp-hier plan`` command (``zeropp_hier/tools/cli.py``) and the ``auto`` preset
(``zeropp_hier/deepspeed/auto.py``) are its users."""
