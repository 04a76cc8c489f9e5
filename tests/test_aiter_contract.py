"""The aiter backend against aiter's real sources, not only its documentation (aiter is never imported).

* The wheel the package index serves for ``pip install amd-aiter`` (`aiter_fp4.AITER_VERSION`), fetched once with pip
  into pytest's cache (skipped, with pip's reason, when offline): every call the backend builds for that version binds
  to the signatures read from the wheel's sources (names, the C++ parameter each value reaches, defaults left to aiter),
  and `metadata_buffer_shapes` equals what the wheel's own ``get_mla_metadata_info_v1`` computes for MI300X (304 CUs)
  and MI355X (256 CUs): its code runs, with only the device query answered by the CU count.
* Every release tag v0.1.7 ... v0.1.20.post1 (`tests/aiter_signatures.json`, read from each tag by `aiter_contract`):
  the calls for the tags mlalab accepts bind to the tag's signatures; the others are refused.
"""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from aiter_contract import Role, check_call, load_snapshots, wheel_function_source, wheel_signatures
from aiter_fp4 import AITER_VERSION, WheelUnavailable, fetch_wheel

from mlalab.backends.aiter_abi import WINDOWS, AiterAbi, abi_for_version, window_of
from mlalab.backends.aiter_args import (
    AiterSettings,
    info_kwargs,
    metadata_buffer_shapes,
    metadata_kwargs,
    mla_decode_fwd_kwargs,
    reduce_kwargs,
    settings_for_precision,
    stage1_kwargs,
)
from mlalab.quant.precision import PRECISIONS

SNAPSHOTS = load_snapshots(Path(__file__).parent / "aiter_signatures.json")
BUFFERS = ("work_metadata", "work_indptr", "work_info_set", "reduce_indptr", "reduce_final_map", "reduce_partial_map")
#: Defaults the backend deliberately leaves to aiter although they are not "off" values: the metadata's kernel version
#: (v0.1.18 and later; its default is the release's own choice, what every caller gets).
ALLOWED_DEFAULTS: dict[str, tuple[str, ...]] = {"get_mla_metadata_v1": ("mla_version",)}


@pytest.fixture(scope="module")
def wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        cache = getattr(request.config, "cache", None)
        return fetch_wheel(cache.mkdir("amd-aiter-wheel") if cache else tmp_path_factory.mktemp("amd-aiter-wheel"))
    except WheelUnavailable as e:
        pytest.skip(str(e))


def backend_calls(
    abi: AiterAbi, settings: AiterSettings, fwd_params: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    """The keyword dictionaries the backend passes to the five functions, with `Role` stand-ins for every tensor
    (`fwd_params`: the parameter names of the installed ``mla_decode_fwd``, which the backend inspects)."""
    buffers = {name: Role(name) for name in BUFFERS}
    fp8 = settings.q_dtype == "fp8" or settings.kv_dtype == "fp8"
    dt = {"fp8": torch.float8_e4m3fnuz, "bf16": torch.bfloat16}
    common = dict(qo_indptr=Role("qo_indptr"), kv_indptr=Role("kv_indptr"), kv_last_page_lens=Role("kv_last_page_lens"))
    t = dict(q=Role("q"), kv_buffer=Role("kv_buffer"), kv_indices=Role("kv_indices"), buffers=buffers, q_len=2)
    scales = dict(q_scale=Role("q_scale"), kv_scale=Role("kv_scale"))
    return {
        "get_mla_metadata_info_v1": info_kwargs(
            abi, settings=settings, batch=4, q_len=2, q_torch_dtype=dt[settings.q_dtype],
            kv_torch_dtype=dt[settings.kv_dtype],
        ),
        "get_mla_metadata_v1": metadata_kwargs(
            abi, settings=settings, buffers=buffers, q_len=2, q_torch_dtype=dt[settings.q_dtype],
            kv_torch_dtype=dt[settings.kv_dtype], **common,
        ),
        "mla_decode_stage1_asm_fwd": stage1_kwargs(
            abi, sm_scale=576**-0.5, logits=Role("logits"), attn_lse=Role("attn_lse"), out=Role("out"),
            final_lse=Role("final_lse"), fp8=fp8, **t, **common, **scales,
        ),
        "mla_reduce_v1": reduce_kwargs(
            abi, logits=Role("logits"), attn_lse=Role("attn_lse"), buffers=buffers, q_len=2, num_kv_splits=304,
            out=Role("out"), final_lse=Role("final_lse"),
        ),
        "mla_decode_fwd": mla_decode_fwd_kwargs(
            out=Role("out"), sm_scale=576**-0.5, num_kv_splits=304, settings=settings, abi=abi,
            accepts=fwd_params, return_lse=True, **t, **common, **scales,
        ),
    }  # fmt: skip


def runnable_settings(abi: AiterAbi) -> list[AiterSettings]:
    modes = ["fast"] + ([] if "mode='intra-batch'" in abi.unsupported() else ["intra-batch"])
    return [
        settings_for_precision(s.precision.value, mode=m) for s in PRECISIONS.values() if not s.kv_fp4 for m in modes
    ]


def contract_problems(functions: dict[str, Any], abi: AiterAbi) -> list[str]:
    problems = []
    fwd = functions["mla_decode_fwd"]
    fwd_params = tuple(p[0] for p in fwd["params"]) if fwd else ()
    for settings in runnable_settings(abi):
        for fn, kwargs in backend_calls(abi, settings, fwd_params).items():
            found = check_call(fn, functions[fn], kwargs, ALLOWED_DEFAULTS.get(fn, ()))
            problems += [f"{settings.mode.value} {settings.q_dtype}/{settings.kv_dtype}: {p}" for p in found]
    return problems


# ------------------------------------------------------------------------------------------------- the PyPI wheel


def test_the_wheel_falls_in_the_legacy_window(wheel: Path) -> None:
    assert wheel.name == f"amd_aiter-{AITER_VERSION}-py3-none-any.whl"
    assert window_of(AITER_VERSION) == list(WINDOWS)[1]
    abi = abi_for_version(AITER_VERSION)
    assert abi.legacy and not abi.stage1_has_lse and "mode='intra-batch'" in abi.unsupported()
    with pytest.raises(ValueError, match="cannot run mode='intra-batch'"):
        info_kwargs(abi, settings=AiterSettings(), batch=4, q_len=1, q_torch_dtype=torch.bfloat16,
                    kv_torch_dtype=torch.bfloat16)  # fmt: skip


def test_every_call_binds_to_the_wheel(wheel: Path) -> None:
    functions = wheel_signatures(wheel)
    abi = abi_for_version(AITER_VERSION)
    assert contract_problems(functions, abi) == []
    # The wheel's metadata stub and binding disagree on the order of work_indptr and the work info: the check sees
    # the binding (it would reject the naive call, next test).
    meta = functions["get_mla_metadata_v1"]
    names = [p[0] for p in meta["params"]]
    assert names[6:8] == ["work_indptr", "work_info"] and meta["binding"][6:8] == ["work_info_set", "work_indptr"]


def test_the_contract_check_catches_a_call_that_no_longer_binds(wheel: Path) -> None:
    """Three broken calls the check must refuse: the metadata buffers named as the stub names them (they would land
    in each other's C++ parameter), the newer releases' stage 1 (work_meta_data, page_size, nhead_kv), and a renamed
    keyword."""
    functions = wheel_signatures(wheel)
    legacy = abi_for_version(AITER_VERSION)
    kw = backend_calls(legacy, AiterSettings(mode="fast"))
    naive = dict(kw["get_mla_metadata_v1"], work_indptr=Role("work_indptr"), work_info=Role("work_info_set"))
    found = check_call("get_mla_metadata_v1", functions["get_mla_metadata_v1"], naive)
    assert any("reaches 'work_info_set'" in p for p in found), found
    newer = backend_calls(abi_for_version("0.1.11"), AiterSettings(mode="fast"))["mla_decode_stage1_asm_fwd"]
    found = check_call("mla_decode_stage1_asm_fwd", functions["mla_decode_stage1_asm_fwd"], newer)
    assert found and "work_metadata" in found[0], found  # the wheel's stage 1 names it work_metadata
    renamed = dict(kw["mla_reduce_v1"])
    renamed["output"] = renamed.pop("final_output")
    assert check_call("mla_reduce_v1", functions["mla_reduce_v1"], renamed)


class _Torch(types.ModuleType):
    """torch, except that the device query answers with a given CU count (nothing else is replaced)."""

    def __init__(self, cus: int) -> None:
        super().__init__("torch")
        props = types.SimpleNamespace(multi_processor_count=cus)
        self.cuda = types.SimpleNamespace(current_device=lambda: 0, get_device_properties=lambda _dev: props)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def wheel_info(wheel: Path, cus: int, fp8: torch.dtype) -> Any:
    """The wheel's own get_mla_metadata_info_v1, compiled from its source, run with `cus` compute units."""
    namespace: dict[str, Any] = {"math": math, "torch": _Torch(cus), "dtypes": types.SimpleNamespace(fp8=fp8)}
    exec(compile(wheel_function_source(wheel, "get_mla_metadata_info_v1"), "aiter/ops/attention.py", "exec"), namespace)
    return namespace["get_mla_metadata_info_v1"]


def _shape(s: Any) -> tuple[int, ...]:
    return (s,) if isinstance(s, int) else tuple(s)


@pytest.mark.parametrize(
    "arch, cus, fp8", [("gfx942", 304, torch.float8_e4m3fnuz), ("gfx950", 256, torch.float8_e4m3fn)]
)
def test_buffer_sizes_equal_the_wheels_arithmetic(wheel: Path, arch: str, cus: int, fp8: torch.dtype) -> None:
    info = wheel_info(wheel, cus, fp8)
    abi = abi_for_version(AITER_VERSION)
    dt = {"fp8": fp8, "bf16": torch.bfloat16}
    checked = 0
    for p in (p for p in PRECISIONS.values() if not p.kv_fp4):  # aiter's persistent decode: fp8 / bf16 KV
        settings = AiterSettings(mode="fast", q_dtype=p.q_format, kv_dtype=p.kv_format)
        for batch in (1, 4, 32, 64, 128, 256, 303, 304, 305, 1000):
            for q_len in (1, 2, 4):
                kw = info_kwargs(abi, settings=settings, batch=batch, q_len=q_len, q_torch_dtype=dt[p.q_format],
                                 kv_torch_dtype=dt[p.kv_format])  # fmt: skip
                theirs = [(_shape(s), d) for s, d in info(**kw)]
                ours = metadata_buffer_shapes(batch=batch, q_len=q_len, num_cus=cus, settings=settings, arch=arch)
                assert [ours[n] for n in BUFFERS] == theirs, (batch, q_len, p.precision)
                checked += 1
    assert checked == 90
    # The comparison can fail: the wheel's fast_mode=False (cost-heap) sizes are not our fast-mode formula.
    kw = info_kwargs(abi, settings=AiterSettings(mode="fast"), batch=4, q_len=1, q_torch_dtype=fp8, kv_torch_dtype=fp8)
    slow = [(_shape(s), d) for s, d in info(**dict(kw, fast_mode=False))]
    ours = metadata_buffer_shapes(batch=4, q_len=1, num_cus=cus, settings=AiterSettings(mode="fast"), arch=arch)
    assert slow[2] == ((4 * cus, 8), torch.int32) and ours["work_info_set"][0] == (4 + cus - 1, 8)


# ------------------------------------------------------------------------------------------- the tagged releases


def test_snapshots_cover_every_release_tag() -> None:
    tags = list(SNAPSHOTS)
    assert tags[0] == "v0.1.7" and tags[-1] == "v0.1.20.post1" and len(tags) == 40
    assert all(len(v["commit"]) == 40 for v in SNAPSHOTS.values())


@pytest.mark.parametrize("tag", list(SNAPSHOTS))
def test_every_call_binds_to_each_accepted_release(tag: str) -> None:
    version = tag[1:]
    if window_of(version) is None:
        with pytest.raises(ValueError, match="not supported"):
            abi_for_version(version)
        return
    abi = abi_for_version(version)
    assert contract_problems(SNAPSHOTS[tag]["functions"], abi) == []


def test_refused_releases_would_not_bind() -> None:
    """The releases between the windows are refused for a reason: the nearest window's calls do not bind there."""
    for tag, like in (("v0.1.7.post4", "0.1.7.post2"), ("v0.1.10.post1", "0.1.10.post2")):
        assert contract_problems(SNAPSHOTS[tag]["functions"], abi_for_version(like)), tag


def test_the_wheel_has_the_signatures_of_its_tags(wheel: Path) -> None:
    """The wheel's five functions are those of v0.1.7.post2, plus a defaulted max_split_per_batch in the metadata."""
    ours, tag = wheel_signatures(wheel), SNAPSHOTS["v0.1.7.post2"]["functions"]
    assert {f for f in ours if ours[f] != tag[f]} == {"get_mla_metadata_v1"}
    extra = [p for p in ours["get_mla_metadata_v1"]["params"] if p not in tag["get_mla_metadata_v1"]["params"]]
    assert extra == [["max_split_per_batch", "pos", "-1"]]
