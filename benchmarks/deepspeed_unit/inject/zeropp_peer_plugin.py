"""pytest plugin of benchmarks/deepspeed_unit (loaded with ``-p zeropp_peer_plugin``).

Per test it empties the marks directory of the injector (``sitecustomize.py``) before the test,
and after it appends one JSON line to ``ZEROPP_HIER_PEER_RESULTS``: the node id, the outcome
(passed / failed / error / skipped / xfailed / xpassed, or ``hang`` when DeepSpeed's launcher
ended the session with "Test hanged"), the duration, the tail of the failure text and the marks
the ranks left (stage-3 initialize calls, injections, zeropp_hier refusals, engine classes).

With ``ZEROPP_HIER_PEER_COLLECT`` set it writes the collected tests there, one JSON
object a line (node id, parameters, markers, class, class world size).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time

_MARKS = os.environ.get("ZEROPP_HIER_PEER_MARKS")
_RESULTS = os.environ.get("ZEROPP_HIER_PEER_RESULTS")
_COLLECT = os.environ.get("ZEROPP_HIER_PEER_COLLECT")

_TEST_TIMEOUT = float(os.environ.get("ZEROPP_HIER_PEER_TEST_TIMEOUT", "0") or 0)

_state = {"current": None, "reports": {}, "start": 0.0, "seq": 0}


def _watchdog(seq: int) -> None:
    """A test still running after ZEROPP_HIER_PEER_TEST_TIMEOUT seconds: record it as ``hang``
    and end this pytest process (run.py goes on with the rest). DeepSpeed's own launcher
    timeout does not cover its pool teardown, which can wait forever."""
    time.sleep(_TEST_TIMEOUT)
    if _state["seq"] != seq or _state["current"] is None:
        return
    import faulthandler
    import sys

    sys.stderr.write(f"\nzeropp_peer_plugin: {_state['current']} still running after {_TEST_TIMEOUT:.0f}s\n")
    faulthandler.dump_traceback(all_threads=True)
    _write(
        {
            "nodeid": _state["current"],
            "outcome": "hang",
            "duration": round(time.time() - _state["start"], 2),
            "text": f"still running after {_TEST_TIMEOUT:.0f}s (plugin watchdog)",
            "marks": _read_marks(),
        }
    )
    sys.stderr.flush()
    os._exit(3)


def _clear_marks() -> None:
    if not _MARKS:
        return
    for p in glob.glob(os.path.join(_MARKS, "*")):
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.remove(p)
            except OSError:
                pass


def _read_marks() -> dict:
    out = {"stage3": 0, "injected": 0, "patched": 0, "refused": [], "engines": [], "worlds": []}
    if not _MARKS:
        return out
    for p in sorted(glob.glob(os.path.join(_MARKS, "*.json"))):
        try:
            with open(p) as f:
                m = json.load(f)
        except (OSError, ValueError):
            continue
        ev = m.get("event")
        if ev in ("stage3", "injected", "patched"):
            out[ev] += 1
            if ev == "injected":
                out["worlds"].append(m.get("world"))
        elif ev == "refused":
            out["refused"].append({"type": m.get("type"), "field": m.get("field"), "msg": m.get("msg")})
        elif ev == "engine":
            out["engines"].append({"cls": m.get("cls"), "optimizer": m.get("optimizer"), "hier": m.get("hier")})
    # one entry per distinct value is enough (every rank leaves the same mark)
    out["refused"] = [dict(t) for t in {tuple(sorted(r.items())) for r in out["refused"]}]
    out["engines"] = [dict(t) for t in {tuple(sorted(e.items())) for e in out["engines"]}]
    out["worlds"] = sorted({w for w in out["worlds"] if w is not None})
    return out


def _write(rec: dict) -> None:
    if not _RESULTS:
        return
    with open(_RESULTS, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def pytest_collection_finish(session):
    if _COLLECT:
        with open(_COLLECT, "w") as f:
            for item in session.items:
                cs = getattr(item, "callspec", None)
                params = {k: repr(v) for k, v in (cs.params.items() if cs else [])}
                marks = sorted({m.name for m in item.iter_markers()})
                f.write(
                    json.dumps(
                        {
                            "nodeid": item.nodeid,
                            "params": params,
                            "markers": marks,
                            "cls": item.cls.__name__ if item.cls else None,
                            "world_size": repr(getattr(item.cls, "world_size", None)),
                        }
                    )
                    + "\n"
                )


def pytest_runtest_logstart(nodeid, location):
    _clear_marks()
    _state["current"] = nodeid
    _state["reports"] = {}
    _state["start"] = time.time()
    _state["seq"] += 1
    if _TEST_TIMEOUT > 0:
        import threading

        threading.Thread(target=_watchdog, args=(_state["seq"],), daemon=True).start()


def pytest_runtest_logreport(report):
    _state["reports"][report.when] = report


def _outcome(reports) -> tuple[str, str]:
    text = ""
    for when in ("setup", "call", "teardown"):
        r = reports.get(when)
        if r is None:
            continue
        if hasattr(r, "wasxfail"):
            return ("xfailed" if r.skipped else "xpassed"), ""
        if r.failed:
            return ("error" if when != "call" else "failed"), _tail(str(r.longrepr))
        if r.skipped:
            lr = r.longrepr
            text = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
            return "skipped", text
    return "passed", text


def pytest_runtest_logfinish(nodeid, location):
    outcome, text = _outcome(_state["reports"])
    _write(
        {
            "nodeid": nodeid,
            "outcome": outcome,
            "duration": round(time.time() - _state["start"], 2),
            "text": text,
            "marks": _read_marks(),
        }
    )
    _state["current"] = None
    _state["seq"] += 1


def pytest_sessionfinish(session, exitstatus):
    # DeepSpeed's launcher calls pytest.exit("Test hanged") on a timeout: no report is made
    if _state["current"] is not None:
        _write(
            {
                "nodeid": _state["current"],
                "outcome": "hang",
                "duration": round(time.time() - _state["start"], 2),
                "text": f"session ended during the test (exit status {exitstatus})",
                "marks": _read_marks(),
            }
        )
        _state["current"] = None
