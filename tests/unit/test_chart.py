"""The job's end-of-run chart (app/monitoring/chart.py): a real PNG from metrics rows, written atomically."""

import os
import struct

import pytest

from zeropp_hier.app.monitoring import chart

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rows(n=12):
    return [{"step": i, "loss": 5.0 / (1 + i), "tokens_per_s": 1000.0 + 10 * i} for i in range(n)]


def test_the_chart_is_a_png_beside_the_summary(tmp_path):
    path = chart.write(_rows(), str(tmp_path), "GPT-NeoX 0.2M, preset frontier")
    assert path == os.path.join(str(tmp_path), "metrics.png")
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (800, 320)  # 8 x 3.2 inches at 100 dpi
    assert len(data) > 10_000  # two drawn panels, not an empty canvas
    assert sorted(os.listdir(tmp_path)) == ["metrics.png"]  # no temporary file left


def test_different_runs_draw_different_charts():
    flat = [{**r, "loss": 1.0} for r in _rows()]
    assert chart.render(_rows()) != chart.render(flat)


def test_no_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="no steps"):
        chart.render([])
