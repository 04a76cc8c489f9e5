"""Split-KV figures and panel driven from Python, and notebook 03 executed headless."""

from __future__ import annotations

from mlalab.plan import indptrs_for, make_plan
from mlalab.plots.splitkv import cu_load_figure, reduce_groups_figure, work_map_figure
from mlalab.widgets.splitkv import split_kv_panel


def test_figures_reflect_the_plan() -> None:
    qo, kv = indptrs_for([1024] * 4)
    p = make_plan("aiter-fast", qo, kv, "mi300x")
    wm = work_map_figure(p)
    z = wm.data[0].z
    assert len(z[0]) == 304 and sum(v is not None for v in z[0]) == 128
    assert "176 idle" in wm.layout.title.text
    assert "kv [1024, 1056)" in wm.data[0].text[0][32]
    load = cu_load_figure(p)
    assert sum(sum(t.y) for t in load.data) == 4096
    red = reduce_groups_figure(p)
    assert list(red.data[0].y) == [32, 32, 32, 32]


def test_panel_controls_change_figures_and_show_errors() -> None:
    p = split_kv_panel()
    assert p.plan is not None and p.plan.n_work == 20
    before = p.figures["work_map"].data[0].z
    p.controls["target"].value = "mi300x"
    assert p.plan.n_work == 64 and p.figures["work_map"].data[0].z != before
    assert "gfx942" in p.message.value
    p.controls["planner"].value = "aiter-fast"
    assert p.plan.n_work == 88  # max_split_per_batch 32: 22 fragments per request
    p.controls["splits"].value = 0
    assert p.plan.n_work == 128
    p.controls["kv_mode"].value = "ragged"
    assert len(set(p.plan.kv_lens)) > 1
    assert "rel-L2 vs reference" in p.figures["step"].layout.title.text
    err = float(p.figures["step"].layout.title.text.split("reference ")[1])
    assert err < 1e-12
    p.controls["request"].value = 2
    assert p.figures["step"].layout.title.text.startswith("Request 2")
    p.controls["target"].value = "custom"
    good = p.plan
    assert good.num_cus == 64
    p.controls["cus"].value = -4
    assert "Cannot plan" in p.message.value and "CU count" in p.message.value and p.plan is good
