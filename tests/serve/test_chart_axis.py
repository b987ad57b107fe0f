"""The page's chart axis (static/chart.js `yAxis`), computed by Node: the logit lens's nats
chart draws y at log10(1 + y) (issue 41, section 4: on SmolLM2 the embedding's KL, ~100 nats,
set a linear axis and layers 1-30, 0.1-10 nats, lay flat along its bottom)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from sheepop.serve.page.routes import STATIC

NODE = shutil.which("node")
# KL(p_L || p_l) by layer, as SmolLM2's lens gives it: the embedding's, then 0.1-10 nats, then 0
KL = [101.3, 9.2, 6.5, 4.1, 2.2, 1.0, 0.4, 0.1, 0.0]


def axis(values: list[float], scale: str) -> dict:
    """yAxis(values, scale): its ticks and the height of each value (a fraction of the plot)."""
    script = (f"import {{ yAxis }} from {json.dumps((STATIC / 'chart.js').as_uri())};\n"
              f"const v = {json.dumps(values)}, a = yAxis(v, {json.dumps(scale)});\n"
              "console.log(JSON.stringify({ticks: a.ticks, at: v.map(a.at)}));")
    done = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(NODE is None, reason="needs Node.js")
def test_the_lens_kl_after_the_embedding_fills_the_log_axis_not_its_floor():
    flat, log = axis(KL, "linear"), axis(KL, "log1p")
    after = lambda a: max(a["at"][1:]) - min(a["at"][1:])  # noqa: E731
    assert after(flat) < 0.1  # what the page drew: 9 nats of 101 at the bottom tenth
    assert after(log) > 0.4   # log10(10.2) of log10(102.3) of the height, less the margins
    assert log["at"] == sorted(log["at"], reverse=True)  # the order of the values kept
    assert log["ticks"][0] == 0 and {1, 10, 100} <= set(log["ticks"])
    assert all(0 <= y <= 1 for y in log["at"])


@pytest.mark.skipif(NODE is None, reason="needs Node.js")
def test_the_log_axis_ticks_leave_room_for_their_labels():
    """A short range (a small model's KL, 0-10 nats) put 0, 0.1 and 0.3 within 11% of the
    height: their labels overlapped. Kept ticks are an eighth of the height apart."""
    for values in (KL, [10.2, 1.6, 0.02], [0.5, 0.2, 0.0]):
        marks = axis(values, "log1p")["ticks"]
        assert marks[0] == 0 and len(marks) >= 2, (values, marks)
        # the ticks' heights (added to the values they can only widen the range, which shrinks
        # the gaps: the check is the stricter for it)
        spots = axis(values + marks, "log1p")["at"][len(values):]
        assert all(b - c >= 0.12 for c, b in zip(spots, spots[1:])), (values, marks, spots)


@pytest.mark.skipif(NODE is None, reason="needs Node.js")
def test_the_lens_chart_asks_for_the_log_axis():
    assert 'yScale: "log1p"' in (STATIC / "lens.js").read_text(encoding="utf-8")
