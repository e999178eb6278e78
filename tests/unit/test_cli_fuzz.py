"""The command line never crashes on a bad value: over 1,200 generated bad values of every
option of ``zeropp-hier plan``, ``probe`` and ``checkpoint`` (driven in-process through
``zeropp_hier.__main__.main``), each ends with a non-zero exit and one clean error line
naming the option and the value, never a traceback ([Note: command-line values] in
zeropp_hier/tools/cli.py).

Every generated value is bad by construction (a valid one would run the planner, or start
torch.distributed for ``probe``); the strategies below say why each is bad."""

import atexit
import contextlib
import io
import json
import math
import os
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeropp_hier import __main__ as command

FUZZ = settings(
    max_examples=1200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TMP = tempfile.mkdtemp(prefix="zeropp-cli-fuzz-")
atexit.register(shutil.rmtree, TMP, True)
MISSING = os.path.join(TMP, "does-not-exist")


def _float_or_none(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def _int_or_none(text: str):
    try:
        return int(text.strip())
    except ValueError:
        return None


# -- bad values, by kind --------------------------------------------------------------------------
junk = st.text(min_size=0, max_size=12)
special = st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-0", "0", "0.0", "", " ", "1,5", "0x10"])


def bad_positive_float(hi: float):
    """Not a finite number in (0, hi]."""
    numbers = st.one_of(
        st.floats(max_value=0.0),
        st.floats(min_value=hi, exclude_min=True),
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not math.isfinite(x)),
    ).map(repr)
    return st.one_of(junk, special, numbers).filter(
        lambda t: (v := _float_or_none(t)) is None or not (math.isfinite(v) and 0 < v <= hi)
    )


def bad_int(lo: int, hi: int):
    """Not a whole number in [lo, hi]."""
    numbers = st.one_of(st.integers(max_value=lo - 1), st.integers(min_value=hi + 1)).map(str)
    fractions = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)).map(repr)
    return st.one_of(junk, special, numbers, fractions).filter(
        lambda t: (v := _int_or_none(t)) is None or not lo <= v <= hi
    )


def bad_params():
    suffixed = st.tuples(
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["K", "M", "B", "T", "X", "b", "kb", ""])
    )
    texts = st.one_of(junk, special, suffixed.map(lambda p: f"{p[0]!r}{p[1]}"))

    def bad(t: str) -> bool:
        from zeropp_hier.tools.cli import MAX_PARAMS, parse_count

        try:
            v = parse_count(t)
        except ValueError:
            return True
        return not (math.isfinite(v) and 1 <= v <= MAX_PARAMS)

    return texts.filter(bad)


def bad_tier_bw():
    tier = st.sampled_from(["gcd", "gpu", "node", "nic", "GCD", "", "gcd "])
    rate = st.one_of(bad_positive_float(1e6), st.floats(0.001, 1e6).map(repr))
    pairs = st.lists(st.tuples(tier, rate).map(lambda p: f"{p[0]}={p[1]}"), min_size=1, max_size=4).map(",".join)
    texts = st.one_of(junk, pairs)

    def bad(t: str) -> bool:
        seen = set()
        for part in t.split(","):
            k, _, v = part.strip().partition("=")
            r = _float_or_none(v)
            if k not in ("gcd", "gpu", "node") or k in seen or r is None or not (math.isfinite(r) and 0 < r <= 1e6):
                return True
            seen.add(k)
        return False

    return texts.filter(bad)


def bad_sizes():
    sizes = st.lists(st.integers(-(2**40), 2**40), min_size=0, max_size=4).map(lambda xs: ",".join(map(str, xs)))

    def bad(t: str) -> bool:
        try:
            xs = [int(s.strip()) for s in t.split(",")]
        except ValueError:
            return True
        return len(xs) < 2 or len(set(xs)) < 2 or any(not 4 <= s <= 2**34 or s % 4 for s in xs)

    return st.one_of(junk, sizes).filter(bad)


def bad_choice(choices):
    return st.one_of(junk, st.sampled_from(["FRONTIER", "nccl ", "3", "mpi", "2.0"])).filter(
        lambda t: t not in choices
    )


# probe files whose content is unusable, written under TMP
probe_contents = st.one_of(
    st.binary(max_size=40).map(lambda b: b + b"\xff"),  # not UTF-8
    junk.map(lambda t: ("{" + t).encode()),  # not JSON
    st.sampled_from([b"[]", b"{}", b'{"tiers": {}}', b'{"tiers": []}', b"null", b'{"tiers": {"rack": {}}}']),
    st.tuples(
        st.sampled_from(["gcd", "gpu", "node"]),
        st.one_of(st.none(), st.booleans(), st.floats(max_value=0.0), st.just(float("nan")), junk),
        st.floats(allow_nan=True, allow_infinity=True),
    ).map(lambda c: json.dumps({"tiers": {c[0]: {"bandwidth": c[1], "latency": c[2]}}}).encode()),
    st.tuples(
        st.sampled_from(["gcd", "gpu", "node"]),
        st.floats(1.0, 1e12),
        st.one_of(st.floats(max_value=-1e-9), st.sampled_from([float("nan"), float("inf")]), junk),
    ).map(lambda c: json.dumps({"tiers": {c[0]: {"bandwidth": c[1], "latency": c[2]}}}).encode()),
)
_written = [0]


def probe_file(content: bytes) -> str:
    _written[0] += 1
    path = os.path.join(TMP, f"probe{_written[0]}.json")
    with open(path, "wb") as f:
        f.write(content)
    return path


def _existing_file() -> str:
    path = os.path.join(TMP, "a-file")
    open(path, "w").close()
    return path


# (argv prefix, option, strategy of bad values)
CASES = [
    (["plan"], "--params", bad_params()),
    (["plan"], "--nodes", bad_int(1, 100_000)),
    (["plan", "--cluster", "emulated"], "--node-mbit", bad_positive_float(1e9)),
    (["plan"], "--layers", bad_int(1, 100_000)),
    (["plan"], "--d-model", bad_int(1, 10**7)),
    (["plan"], "--seq-len", bad_int(1, 10**7)),
    (["plan"], "--micro-batch", bad_int(1, 10**7)),
    (["plan"], "--tokens-per-gcd", bad_int(1, 10**12)),
    (["plan"], "--memory-gb", bad_positive_float(1e6)),
    (["plan"], "--device-tflops", bad_positive_float(1e6)),
    (["plan"], "--tier-bw", bad_tier_bw()),
    (["plan"], "--cluster", bad_choice({"frontier", "emulated"})),
    (["plan"], "--dtype-bytes", bad_choice({"2", "4"})),
    (["plan"], "--probe", st.one_of(probe_contents.map(probe_file), st.just(MISSING), st.just(TMP))),
    (["probe"], "--gpus-per-node", bad_int(1, 1024)),
    (["probe"], "--gcds-per-gpu", bad_int(1, 64)),
    (["probe"], "--reps", bad_int(1, 10_000)),
    (["probe"], "--sizes", bad_sizes()),
    (["probe"], "--backend", bad_choice({"nccl", "gloo"})),
    (["probe"], "--out", st.sampled_from([os.path.join(MISSING, "probe.json"), TMP])),
    (["checkpoint", "verify"], None, st.sampled_from([MISSING, os.path.join(MISSING, "x"), "/nonexistent"])),
    (["checkpoint", "to-universal"], None, st.sampled_from([MISSING, "/nonexistent"]).map(lambda d: d)),
    (["checkpoint", "verify"], None, st.builds(_existing_file)),
]


@st.composite
def bad_command_lines(draw):
    prefix, option, values = draw(st.sampled_from(CASES))
    value = draw(values)
    if option is None:  # a positional directory
        argv = [*prefix, value] + (["/tmp/out"] if prefix[-1] == "to-universal" else [])
    else:
        argv = (
            [*prefix, option, value]
            if not value.startswith("-") or draw(st.booleans())
            else [*prefix, f"{option}={value}"]
        )
    return argv, option, value


def _options(command_name: str) -> set:
    from zeropp_hier.tools.cli import options_of

    return options_of(command_name)


def run(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = command.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (1 if e.code else 0)
    return code, err.getvalue()


SEEN = {"cases": 0}


@FUZZ
@given(bad_command_lines())
def test_no_bad_value_ends_in_a_traceback(case):
    argv, option, value = case
    code, err = run(argv)  # any exception other than SystemExit fails the test with its traceback
    SEEN["cases"] += 1
    assert code != 0, (argv, err)
    assert "Traceback" not in err, (argv, err)
    last = err.strip().splitlines()[-1]
    assert "error:" in last, (argv, err)
    if option is not None:
        assert f"argument {option}" in last, (argv, last)
    # a value that is empty, or is itself one of the command's options, reads as a missing value
    missing = value.strip() == "" or value.split("=", 1)[0] in _options(argv[0])
    named = repr(value) in last or value in last or (missing and "expected one argument" in last)
    assert named, (argv, last)


def test_the_drive_covered_at_least_a_thousand_cases():
    # runs after the drive above in file order; on its own it drives it first
    if SEEN["cases"] < 1000:
        test_no_bad_value_ends_in_a_traceback()
    assert SEEN["cases"] >= 1000, SEEN


def test_the_reported_cases_of_the_issue():
    """The exact values of the report: each refused, naming option, value and fix."""
    for argv, option, fix in [
        (["plan", "--params", "20X"], "--params", "positive parameter count"),
        (["plan", "--params", "nan"], "--params", "positive parameter count"),
        (["plan", "--params", "inf"], "--params", "positive parameter count"),
        (["plan", "--params", "-5B"], "--params", "positive parameter count"),
        (["plan", "--params", "0"], "--params", "positive parameter count"),
        (["plan", "--tier-bw", "gcd=0"], "--tier-bw", "above 0"),
        (["plan", "--tier-bw", "gcd=-1"], "--tier-bw", "above 0"),
        (["plan", "--memory-gb", "-1"], "--memory-gb", "above 0"),
        (["plan", "--probe", "/nonexistent"], "--probe", "no such file"),
        (["plan", "--layers", "0"], "--layers", "from 1 to"),
        (["plan", "--d-model", "0"], "--d-model", "from 1 to"),
    ]:
        code, err = run(argv)
        last = err.strip().splitlines()[-1]
        assert code == 2 and f"argument {option}: got {argv[-1]!r}" in last and fix in last, (argv, err)
    code, err = run(["checkpoint", "verify", "/nonexistent"])
    assert code == 2 and "'/nonexistent': no such directory" in err
