"""Split-KV figures and panel driven from Python, and notebook 03 executed headless."""

from __future__ import annotations

import pandas as pd
import pytest

from mlalab.plan import indptrs_for, make_plan
from mlalab.plan.doctor import doctor
from mlalab.plan.explore import CostModel
from mlalab.plots.splitkv import (
    coverage_figure,
    cu_load_figure,
    gantt_figure,
    model_vs_measured_figure,
    reduce_groups_figure,
    targets_figure,
    work_map_figure,
)
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
    p = split_kv_panel(target="mi355x", batch=4, kv_mode="uniform")
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


def test_default_panel_teaches_a_ragged_batch_with_differing_merge_weights() -> None:
    p = split_kv_panel()
    assert p.plan.kv_lens == (16384,) + (1024,) * 15 and p.plan.num_cus == 132
    # the shown request (the long one) is split; peaked inputs (unit std, q x 3) make its merge weights differ
    w = [t for t in p.figures["step"].data if t.name == "merge weight"][0].y
    assert len(w) == 9 and max(w) - min(w) > 0.05 and abs(sum(w) - 1) < 1e-12
    assert p.rel_l2 is not None and p.rel_l2 < 1e-13 and "rel-L2 vs the exact reference" in p.merge.value
    # the competition's inputs give (nearly) equal weights: the control is what makes the point
    p.controls["dist"].value = "competition"
    p.controls["q_scale"].value = 1.0
    w = [t for t in p.figures["step"].data if t.name == "merge weight"][0].y
    assert max(w) - min(w) < 0.01
    # the step control: after 3 works the merge is not drawn yet
    p.controls["step"].value = 3
    assert "after 3 of 9 works" in p.figures["step"].layout.title.text
    assert not [t for t in p.figures["step"].data if t.name == "merge weight"]
    # three GPUs side by side, zoomed to their busy CUs
    titles = [a.text for a in p.figures["targets"].layout.annotations]
    assert [t.split(":")[0] for t in titles] == ["H200", "MI300X", "MI355X"]
    # the recorded per-CTA time line appears for a recorded shape of the simple plan
    assert len(p.timeline_box.children) == 1
    p.controls["planner"].value = "simple"
    p.controls["kv_mode"].value = "uniform"
    p.controls["batch"].value = 32
    assert len(p.timeline_box.children) == 2 and "measured on the H200" in p.timeline_note.value


def test_panel_teaches_the_causal_mask_of_speculative_decode() -> None:
    """q_len 4 under the causal mask, 40 CUs: a 130-token request is cut at 64 and 128, and q rows 0 and 1 see none
    of the last work's 2 tokens: its partial LSE is drawn as -inf with weight 0, the merge text says why, the
    emulator still equals the reference; the last row sees it (weight > 0), and without the mask every row does."""
    p = split_kv_panel(planner="simple", batch=4, kv_len=130, kv_mode="uniform", q_len=4, causal=True)
    p.controls["target"].value = "custom"
    p.controls["cus"].value = 40
    weights = lambda: [t for t in p.figures["step"].data if t.name == "merge weight"][0].y  # noqa: E731
    empty = lambda: [t for t in p.figures["step"].data if t.name.startswith("L_i = −∞")]  # noqa: E731
    assert p.controls["row"].max == 3 and len(weights()) == 3
    assert weights()[-1] == 0 and empty() and "the causal mask" in p.merge.value
    assert "q row 0 of 4" in p.figures["step"].layout.title.text and p.rel_l2 < 1e-13
    p.controls["row"].value = 3  # the last row sees every token
    assert weights()[-1] > 0 and not empty() and "q row 3 of 4" in p.figures["step"].layout.title.text
    p.controls["row"].value = 0
    p.controls["causal"].value = False
    assert weights()[-1] > 0 and not empty() and p.rel_l2 < 1e-13


def test_gantt_targets_and_zoom() -> None:
    qo, kv = indptrs_for([4096, 100, 100])
    p = make_plan("aiter-intra-batch", qo, kv, "mi355x")
    g = gantt_figure(p, overhead=10)
    assert sum(sum(t.x) for t in g.data) == 4296 + 10 * p.n_work
    last = max(p.work_cus().tolist())
    assert tuple(g.layout.yaxis.range) == (last + 0.5, -0.5)
    assert tuple(work_map_figure(p).layout.xaxis.range) == (-0.5, last + 0.5)
    t = targets_figure({"A": p, "B": make_plan("simple", qo, kv, 8)})
    assert len(t.data) == 2 and len(t.data[0].x) == last + 1
    with pytest.raises(ValueError, match="overhead"):
        gantt_figure(p, overhead=-1)


def test_coverage_figure_draws_the_doctor_s_holes() -> None:
    qo, kv = indptrs_for([3000, 700])
    good = make_plan("aiter-fast", qo, kv, 16)
    wi = good.work_info.clone()
    wi[1, 4:6] += 32
    import dataclasses

    bad = dataclasses.replace(good, work_info=wi)
    rep = doctor(bad, qo, kv)
    fig = coverage_figure(bad, kv, rep.findings)
    names = [t.name for t in fig.data]
    assert names == ["works (colour = CU)", "not covered", "covered twice"]
    assert list(fig.data[1].x) == [32] and list(fig.data[2].x) == [32]


def test_model_vs_measured_figure() -> None:
    df = pd.DataFrame({"mix": ["a"] * 4, "seed": [0] * 4, "policy": list("pqrs"), "makespan": [1, 2, 3, 4],
                       "reduce_reads": [0, 0, 1, 0], "us_median": [10.0, 20.0, 15.0, 40.0]})  # fmt: skip
    fig = model_vs_measured_figure(df, CostModel(reduce_row=0))
    assert "ρ within a batch 0.80 (makespan alone 0.80" in fig.layout.title.text
    fig = model_vs_measured_figure(df, CostModel(reduce_row=2))  # costs 1, 2, 5, 4: another order
    assert "ρ within a batch 0.80" not in fig.layout.title.text and list(fig.data[0].x) == [1, 2, 5, 4]
    with pytest.raises(ValueError, match="columns"):
        model_vs_measured_figure(df.drop(columns="us_median"))


def test_split_kv_panel_exports_the_plan_and_shows_its_work(tmp_path) -> None:
    import pandas as pd

    from mlalab.widgets.splitkv import split_kv_panel

    p = split_kv_panel(batch=4, kv_len=300, kv_mode="uniform")
    assert "updated in" in p.busy.widget.value
    p.export.folder = tmp_path
    path = p.export.save_csv()
    works = pd.read_csv(path)
    assert len(works) == p.plan.n_work and {"cu", "kv_start", "kv_end"} <= set(works.columns)
    (html, *_) = p.export.save_figures("html")
    assert html.stat().st_size > 1000
