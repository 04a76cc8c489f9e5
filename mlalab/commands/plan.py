"""``python -m mlalab plan``: build a split-KV work plan and print aiter's metadata tensors and a summary."""

from __future__ import annotations

import argparse

from ..plan import PLANNERS, indptrs_for, make_plan
from ..plan.doctor import metadata_dict, save_metadata
from ._common import add_case_arguments, case_from_args, print_json

NAME = "plan"
HELP = "split-KV work plan (aiter v1 metadata layout) for a batch on a target GPU"
ORDER = 30


def add_plan_arguments(p: argparse.ArgumentParser, *, default_planner: str | None = "aiter-intra-batch") -> None:
    """Planner options shared by `plan` and `decode` (defaults None in `decode` = the backend's own)."""
    g = p.add_argument_group("split-KV plan")
    g.add_argument("--planner", default=default_planner, choices=list(PLANNERS), help="planner (default %(default)s)")
    g.add_argument(
        "--target",
        default="mi355x" if default_planner else None,
        help="mi355x (256 CUs), mi300x (304), h200 (132 SMs) or a CU count (default %(default)s)",
    )
    g.add_argument(
        "--splits",
        type=int,
        default=None,
        help="num_kv_splits / max_split_per_batch (intra-batch: per-request cap, default 32, ignored on gfx942; "
        "fast/balanced/simple: global budget splits*B, default all CUs; cost-heap: ignored, as in aiter)",
    )
    g.add_argument("--granularity", type=int, default=None, help="kv_granularity in tokens, a power of two (16)")
    g.add_argument("--overhead", type=int, default=None, help="balanced planner: per-work overhead in tokens (64)")


def plan_knobs(a: argparse.Namespace) -> dict[str, object]:
    knobs: dict[str, object] = {}
    if a.splits is not None:
        knobs["max_split_per_batch"] = a.splits
    if a.granularity is not None:
        knobs["kv_granularity"] = a.granularity
    if a.overhead is not None:
        knobs["overhead"] = a.overhead
    return knobs


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_arguments(p)
    add_plan_arguments(p)
    p.add_argument("--json", action="store_true", help="print the tensors and the summary as JSON")
    p.add_argument("--max-rows", type=int, default=40, help="works shown in text mode (default %(default)s)")
    p.add_argument("--save", default=None, metavar="FILE", help="also write the metadata for `mlalab doctor FILE`")


def run(a: argparse.Namespace) -> int:
    case = case_from_args(a)
    qo_indptr, kv_indptr, *rest = indptrs_for(case.kv_lens, case.q_len, page_size=case.page_size)
    last = rest[0] if rest else None
    plan = make_plan(
        a.planner,
        qo_indptr,
        kv_indptr,
        a.target,
        q_len=case.q_len,
        page_size=case.page_size,
        kv_last_page_len=last,
        **plan_knobs(a),
    )
    plan.validate(qo_indptr, kv_indptr)
    if a.save:
        save_metadata(a.save, metadata_dict(plan, qo_indptr, kv_indptr, kv_last_page_len=last))
    summ = plan.summary()
    if a.json:
        print_json(
            {
                "kv_lens": list(case.kv_lens),
                "q_len": case.q_len,
                "qo_indptr": qo_indptr,
                "kv_indptr": kv_indptr,
                "summary": summ,
                "n_partial_rows": plan.n_partial_rows,
                **plan.tensors(),
            }
        )
        return 0
    for k, v in summ.items():
        if k == "works_per_request" and len(v) > 16:
            v = f"{v[:16]} ... ({len(v)} requests)"
        print(f"{k:>24}: {v}")
    df = plan.to_frame()
    print()
    if a.max_rows < 0:
        raise ValueError(f"--max-rows must be >= 0, got {a.max_rows}")
    print(df.head(a.max_rows).to_string(index=False))
    if len(df) > a.max_rows:
        print(f"... {len(df) - a.max_rows} more works (use --json for all)")
    print("reduce_indptr:", plan.reduce_indptr.tolist()[:34], "..." if plan.n_tiles > 33 else "")
    return 0
