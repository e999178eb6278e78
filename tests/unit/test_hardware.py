"""The machine report and the fp16 pre-flight agree with what DeepSpeed itself will do."""

from zeropp_hier.detect.hardware import FLAGS_OF_INTEREST, cpu_fp16_supported, cpu_summary, fp16_unsupported_reason


def test_fp16_preflight_asks_deepspeeds_own_question():
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    ds = CPU_Accelerator()
    assert cpu_fp16_supported() == bool(ds.is_fp16_supported())  # it returns None for "no"
    assert (fp16_unsupported_reason(uses_gpu=False) is None) == bool(ds.is_fp16_supported())
    assert (fp16_unsupported_reason(uses_gpu=False) is None) == (__import__("torch").float16 in ds.supported_dtypes())


def test_gpus_are_never_refused_fp16_here():
    assert fp16_unsupported_reason(uses_gpu=True) is None


def test_cpu_summary_names_every_flag_of_interest():
    line = cpu_summary()
    with open("/proc/cpuinfo") as f:
        flags = next(ln for ln in f if ln.startswith("flags")).split(":")[1].split()
    for flag in FLAGS_OF_INTEREST:
        assert f"{flag}={'yes' if flag in flags else 'no'}" in line
