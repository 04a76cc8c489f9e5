"""The one colour table (mlalab.plots.palette): every name the library shows has its own colour, distinct within its
kind, and figures use it whatever else is selected."""

from __future__ import annotations

import pytest

from mlalab.backends import BACKENDS
from mlalab.plots.palette import KINDS, PALETTE, color_for, legend_rank
from mlalab.quant import FP8_FORMATS, KV_SCHEMES, Q_SCHEMES, concrete_names
from mlalab.quant.precision import PRECISIONS
from mlalab.traffic import KV_STORAGE


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        ("backend", list(BACKENDS)),
        ("precision", [str(p) for p in PRECISIONS]),
        ("scheme", [*concrete_names(Q_SCHEMES), *concrete_names(KV_SCHEMES), "fp8-static"]),
        ("scheme", list(KV_STORAGE)),
        ("fp8_format", list(FP8_FORMATS)),
    ],
)
def test_every_name_has_its_own_colour(kind: str, names: list[str]) -> None:
    missing = [n for n in names if n not in PALETTE[kind]]
    assert not missing, f"{kind} names without a colour in the table: {missing}"
    colours = {n: color_for(kind, n) for n in dict.fromkeys(names)}
    assert len(set(colours.values())) == len(colours), f"two {kind} names share a colour: {colours}"


def test_precision_and_scheme_of_the_same_name_agree() -> None:
    assert color_for("precision", "bf16") == color_for("scheme", "bf16")
    assert color_for("scheme", "fp8") == color_for("scheme", "fp8-tensor")  # fp8 storage is per-tensor fp8


def test_unknown_names_are_stable_and_labels_normalised() -> None:
    assert (
        color_for("scheme", "fp8-static:3.5")
        == color_for("scheme", "fp8-static:0.1")
        == PALETTE["scheme"]["fp8-static"]
    )
    assert color_for("scheme", "KV fp8") == color_for("scheme", "fp8")
    assert color_for("backend", "Triton") == color_for("backend", "triton")
    a = color_for("backend", "some-new-backend")
    assert a == color_for("backend", "some-new-backend") and a.startswith("#") and len(a) == 7
    assert legend_rank("backend", "triton") < legend_rank("backend", "flashmla") < legend_rank("backend", "zzz")


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        color_for("colour", "triton")
    with pytest.raises(ValueError, match="name must be"):
        color_for("backend", "")
    assert set(KINDS) == {"backend", "precision", "scheme", "fp8_format"}
