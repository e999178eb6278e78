"""The cost lines of the job's log (zeropp_hier.app.longrun.io_cost): a save's bytes per rank, total,
seconds and rate, and a universal conversion's bytes and seconds, computed from the numbers given."""

from zeropp_hier.app.longrun.io_cost import bytes_by_rank, conversion_line, rate_gbps, save_line

# a ZeRO-3 save of 2 ranks as DeepSpeed names its files, and the recovery script rank 0 writes
SIZES = {
    "zero_pp_rank_0_mp_rank_00_model_states.pt": 1_000_000,
    "zero_pp_rank_0_mp_rank_00_optim_states.pt": 2_000_000_000,
    "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 3_000_000_000,
    "zero_pp_rank_1_mp_rank_00_model_states.pt": 2_000_000,
    "zero_to_fp32.py": 500,
}


def test_bytes_are_counted_for_the_rank_each_file_names():
    assert bytes_by_rank(SIZES) == {0: 2_001_000_500, 1: 3_002_000_000}
    assert bytes_by_rank({}) == {}


def test_rate_is_gigabytes_per_second_and_zero_without_a_duration():
    assert rate_gbps(3e9, 2.0) == 1.5
    assert rate_gbps(3e9, 0.0) == 0.0


def test_the_save_line_has_the_largest_rank_the_total_the_seconds_and_the_rates():
    line = save_line("step5", "/ck", SIZES, 2.5)
    # largest rank 3.002 GB, total 5.003 GB; 5.0030005 / 2.5 = 2.0012 GB/s, 3.002 / 2.5 = 1.2008 GB/s
    assert line == (
        "checkpoint step5 saved in /ck: 3 GB per rank (the largest of 2), 5 GB in all, in 2.50 s: "
        "2 GB/s in all, 1.2 GB/s per rank"
    )
    small = save_line("step1", "/c", {"zero_pp_rank_0_mp_rank_00_optim_states.pt": 12_345_678}, 0.5)
    assert "0.0123 GB per rank (the largest of 1), 0.0123 GB in all, in 0.50 s: 0.0247 GB/s in all" in small


def test_the_conversion_line_has_the_bytes_read_and_written_and_the_seconds():
    line = conversion_line("step2", 4, 2, 6_000_000_000, 4_000_000_000, 4.0)
    assert line == (
        "converted checkpoint step2 (4 ranks -> 2) to the universal format in 4.00 s, each of the 2 ranks "
        "its share: read 6 GB, wrote 4 GB (2.5 GB/s read and written in all)"
    )
