"""Mutation testing: which small deliberate bugs in the numeric CPU code (quant/, plan/, accuracy, reference,
traffic, timing's pure functions) does the CPU test suite let through?

A mutation run. Each mutant is one change to one module: the hand-written ones of issue 33's table (`HAND`), and
generated ones (`generate`: an arithmetic / comparison / boolean operator swapped, a numeric constant changed, min <->
max, a ``not`` dropped) inside the functions named in `TARGETS`. Every mutant is applied to a temporary copy of the
repository (never to this checkout), the module's fast tests run on it (``-m "not slow and not gpu and not ui and not
rocm"``, first failure stops), and the mutant is *killed* (a test failed or timed out), *survived* (every test passed)
or *invalid* (the patch does not apply: the code changed since the table was written). A fork server keeps torch and
pytest imported once; the package under test is imported fresh in each child.

    python scripts/mutate.py                      # everything, ~30-60 min on 2 cores
    python scripts/mutate.py --modules quant --hand-only
    python scripts/mutate.py --files mlalab/traffic.py mlalab/timing.py
    python scripts/mutate.py --files mlalab/quant/schemes.py --functions Fp8Scheme.range_stats   # part of a module
    python scripts/mutate.py --list               # the mutants, without running them
    python scripts/mutate.py --out docs/mutation_run.csv

Writes one CSV row per mutant (module, function, line, mutation, status, the first failing test) and prints the
survivors. docs/mutation_report.md says why each survivor is harmless, or which test was added to kill it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import csv
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = "not slow and not gpu and not ui and not rocm"

#: module -> (functions whose bodies get generated mutants ("Class.method" or "function"; "*" = module level
#: assignments too), the test files that cover it)
TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "mlalab/quant/schemes.py": (
        ("_group_amax", "fp8_scale", "Fp8Scheme.bytes_per_token", "Fp8Scheme.scales", "Fp8Scheme.quantize",
         "Fp8Scheme.fake_quant", "_padded_blocks", "_bf16_scale", "quantize_fp8_per_tensor",
         "FlashMLAV32Scheme.bytes_per_token", "FlashMLAV32Scheme.fake_quant", "MxFp4Scheme.bytes_per_token",
         "NvFp4Scheme.bytes_per_token", "Fp8Scheme.range_stats", "Fp8Scheme.scaled_values"),
        ("tests/test_quant_oracles.py", "tests/test_quant_schemes.py", "tests/test_quant_formats.py",
         "tests/test_mxfp4_aiter.py"),
    ),
    "mlalab/quant/mx.py": (
        ("_floor_log2", "mx_scale_exponent", "mxfp4_quantize", "mxfp4_dequantize", "nvfp4_quantize",
         "nvfp4_dequantize"),
        ("tests/test_quant_oracles.py", "tests/test_quant_schemes.py", "tests/test_mxfp4_aiter.py"),
    ),
    "mlalab/quant/formats.py": (
        ("tensor_amax", "to_float32_exact_for_rounding", "_overflow_mask", "encode_fp8", "e2m1_encode",
         "e2m1_decode", "pack_e2m1", "unpack_e2m1", "e8m0_from_exponent", "e8m0_to_float", "Fp8Format.min_normal",
         "Fp8Format.min_subnormal", "Fp8Format.nan_code"),
        ("tests/test_quant_formats.py", "tests/test_quant_oracles.py", "tests/test_quant_schemes.py",
         "tests/test_mxfp4_aiter.py"),
    ),
    "mlalab/quant/precision.py": (
        ("*", "PrecisionSpec.kv_token_bytes", "PrecisionSpec.q_bytes", "get_precision"),
        ("tests/test_traffic.py", "tests/test_timing_rates.py"),
    ),
    "mlalab/reference.py": (
        ("decode_reference", "decode_naive_loop"),
        ("tests/test_reference.py", "tests/test_executors_discriminate.py", "tests/test_reference_bad_input.py",
         "tests/test_validation.py"),
    ),
    "mlalab/traffic.py": (
        ("*", "kv_bytes_per_token", "DecodeTraffic.total_bytes", "DecodeTraffic.intensity", "DecodeTraffic.floor_us",
         "decode_traffic"),
        ("tests/test_traffic.py", "tests/test_timing_rates.py", "tests/test_timing_views.py",
         "tests/test_timing_recorded.py"),
    ),
    "mlalab/timing.py": (
        ("rotation_copies", "call_bytes", "kv_cache_bytes", "rate_columns", "rel_l2"),
        ("tests/test_timing_rates.py", "tests/test_timing_recorded.py", "tests/test_timing_views.py"),
    ),
    "mlalab/plan/merge.py": (
        ("lse_merge",),
        ("tests/test_lse_merge.py", "tests/test_splitkv_emulate.py", "tests/test_executors_discriminate.py",
         "tests/test_splitkv_plan.py"),
    ),
    "mlalab/plan/emulate.py": (
        ("_stage1", "emulate_plan", "token_operands"),
        ("tests/test_splitkv_emulate.py", "tests/test_executors_discriminate.py"),
    ),
    "mlalab/plan/planners.py": (
        ("intra_batch_splits", "plan_intra_batch", "plan_fast", "plan_cost_heap", "_fill", "plan_balanced",
         "plan_simple"),
        ("tests/test_splitkv_invariants.py", "tests/test_splitkv_plan.py", "tests/test_splitkv_emulate.py",
         "tests/test_aiter_plan.py"),
    ),
    "mlalab/plan/workplan.py": (
        ("WorkPlan.validate", "WorkPlan.cu_loads", "WorkPlan.work_tokens", "WorkPlan._tokens_before"),
        ("tests/test_splitkv_invariants.py", "tests/test_splitkv_plan.py", "tests/test_splitkv_emulate.py",
         "tests/test_aiter_plan.py"),
    ),
    "mlalab/plan/invariants.py": (
        ("check_metadata",),
        ("tests/test_splitkv_invariants.py", "tests/test_splitkv_doctor.py", "tests/test_splitkv_plan.py"),
    ),
    "mlalab/accuracy/metrics.py": (
        ("mismatch_fraction", "output_metrics"),
        ("tests/test_accuracy_metrics.py",),
    ),
}  # fmt: skip

#: module groups for --modules
GROUPS = {
    "quant": ("mlalab/quant/schemes.py", "mlalab/quant/mx.py", "mlalab/quant/formats.py", "mlalab/quant/precision.py"),
    "reference": ("mlalab/reference.py",),
    "traffic": ("mlalab/traffic.py",),
    "timing": ("mlalab/timing.py",),
    "plan": (
        "mlalab/plan/merge.py",
        "mlalab/plan/emulate.py",
        "mlalab/plan/planners.py",
        "mlalab/plan/workplan.py",
        "mlalab/plan/invariants.py",
    ),
    "accuracy": ("mlalab/accuracy/metrics.py",),
}


@dataclass(frozen=True)
class Mutant:
    module: str
    function: str
    line: int
    what: str
    source: str  # the whole mutated module
    hand: bool = False


#: Issue 33's table (and a few more), as (name, module, the exact text, its replacement). Owners: see the report.
HAND: tuple[tuple[str, str, str, str], ...] = (
    ("decode_reference ignores a valid sm_scale=", "mlalab/reference.py",
     "scale = config.sm_scale if sm_scale is None else float(sm_scale)", "scale = config.sm_scale"),
    ("TB/s off by 1000x (rate_columns)", "mlalab/timing.py",
     "tbps = nbytes / (us_median * 1e-6) / 1e12", "tbps = nbytes / (us_median * 1e-6) / 1e9"),
    ("% of copy off by 100x (rate_columns)", "mlalab/timing.py",
     '"pct_copy": 100.0 * tbps / copy_tbps', '"pct_copy": tbps / copy_tbps'),
    ("FlashMLA-V3.2 scales no longer powers of two", "mlalab/quant/schemes.py",
     "s = torch.ldexp(torch.ones_like(r), torch.where(m == 0.5, k - 1, k))", "s = r"),
    ("FlashMLA-V3.2 without the 1e-4 floor", "mlalab/quant/schemes.py",
     ".clamp(min=self.amax_floor)", ""),
    ("fp8 fake_quant returns the input unquantised", "mlalab/quant/schemes.py",
     "        codes, s = self.quantize(x)\n",
     "        return _check_x(x).float()\n        codes, s = self.quantize(x)\n"),
    ("fp8-token fake_quant returns the input unquantised", "mlalab/quant/schemes.py",
     "        codes, s = self.quantize(x)\n",
     "        if self.granularity is Granularity.TOKEN:\n            return _check_x(x).float()\n"
     "        codes, s = self.quantize(x)\n"),
    ("fp8-token groups one head only (token-head)", "mlalab/quant/schemes.py",
     "return a.amax(dim=(-2, -1), keepdim=True)", "return a.amax(dim=-1, keepdim=True)"),
    ("nvfp4 fake_quant returns the input unquantised", "mlalab/quant/schemes.py",
     "return nvfp4_fake_quant(_check_x(x))", "return _check_x(x).float()"),
    ("nvfp4 without its global scale", "mlalab/quant/mx.py",
     "g = (amax / (448.0 * E2M1_MAX)) if float(amax) > 0 else torch.ones((), device=x.device)",
     "g = torch.ones((), device=x.device)"),
    ("mxfp4 fake_quant returns the input unquantised", "mlalab/quant/schemes.py",
     "return mxfp4_fake_quant(_check_x(x), self.rule, self.rounding)", "return _check_x(x).float()"),
    ("block128 scale per row instead of per block", "mlalab/quant/schemes.py",
     "return fp8_scale(_padded_blocks(xf, self.block).abs().amax(-1, keepdim=True), self.fmt)",
     "return fp8_scale(_padded_blocks(xf, self.block).abs().amax((-2, -1), keepdim=True), self.fmt)"),
    ("accuracy mismatch: rtol and atol swapped", "mlalab/accuracy/metrics.py",
     "ok = err <= atol + rtol * r.abs()", "ok = err <= rtol + atol * r.abs()"),
    ("accuracy mismatch: band relative to |out|", "mlalab/accuracy/metrics.py",
     "ok = err <= atol + rtol * r.abs()", "ok = err <= atol + rtol * out.double().abs()"),
    ("plan_balanced cuts ignore kv_granularity", "mlalab/plan/planners.py",
     "take = (remain - ovh) // x.gran * x.gran", "take = remain - ovh"),
    ("plan_fast q_len > 1 tail rule switched off", "mlalab/plan/planners.py",
     "if 0 < left_tokens < x.q_rows(b):", "if False:"),
    ("plan_cost_heap split tolerance 16 -> 0", "mlalab/plan/planners.py",
     "if left - take <= 16:", "if left - take <= 0:"),
    ("WorkPlan.validate misses gaps", "mlalab/plan/invariants.py", "if ks > pos:", "if False:"),
    ("WorkPlan.validate misses overlapping partial rows", "mlalab/plan/invariants.py", "if a0 < end_so_far:",
     "if False:"),
    ("emulator merge in base 2 (exp2)", "mlalab/plan/merge.py",
     "w = torch.exp(lses - m_safe)", "w = torch.exp2(lses - m_safe)"),
    ("emulator merge LSE in base 2 (log2)", "mlalab/plan/merge.py",
     "m_safe + torch.log(den_safe)", "m_safe + torch.log2(den_safe)"),
    ("emulator stage 1 without sm_scale", "mlalab/plan/emulate.py",
     'torch.einsum("qhd,nd->qhn", q, k) * sm_scale', 'torch.einsum("qhd,nd->qhn", q, k)'),
)  # fmt: skip


# ---------------------------------------------------------------- generated mutants
_BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
               ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
               ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}  # fmt: skip
_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}  # fmt: skip


def _scopes(tree: ast.Module) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{sub.name}"] = sub
    return out


def _skipped(tree: ast.AST) -> set[int]:
    """ids of nodes under a raise, an f-string, an assert, a docstring or an annotation: mutating those is noise."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.JoinedStr, ast.Assert)):
            skip.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.arg) and node.annotation is not None:  # annotations are never evaluated here
            skip.update(id(n) for n in ast.walk(node.annotation))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            skip.update(id(n) for n in ast.walk(node.returns))
        if isinstance(node, ast.AnnAssign):
            skip.update(id(n) for n in ast.walk(node.annotation))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and ast.get_docstring(node):
            skip.update(id(n) for n in ast.walk(node.body[0]))
    return skip


def _candidates(root: ast.AST, skip: set[int]) -> list[tuple[ast.AST, str]]:
    """(node, kind) of every mutable node under `root`, in a deterministic order."""
    out = []
    for node in ast.walk(root):
        if id(node) in skip:
            continue
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP_SWAP:
            out.append((node, "binop"))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
            out.append((node, "cmp"))
        elif isinstance(node, ast.BoolOp):
            out.append((node, "boolop"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            out.append((node, "unary"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            out.append((node, "const"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            out.append((node, "minmax"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "amax", "amin", "floor", "ceil", "exp", "exp2", "log", "log2"):  # fmt: skip
            out.append((node, "method"))
    return out


_METHOD_SWAP = {"amax": "amin", "amin": "amax", "floor": "ceil", "ceil": "floor", "exp": "exp2", "exp2": "exp",
                "log": "log2", "log2": "log"}  # fmt: skip


def _mutate(node: ast.AST, kind: str) -> tuple[ast.AST, str]:
    """Apply the mutation in place (or return a replacement node); describe it."""
    if kind == "binop":
        old = type(node.op).__name__
        node.op = _BINOP_SWAP[type(node.op)]()
        return node, f"{old} -> {type(node.op).__name__}"
    if kind == "cmp":
        old = type(node.ops[0]).__name__
        node.ops = [_CMP_SWAP[type(node.ops[0])]()]
        return node, f"{old} -> {type(node.ops[0]).__name__}"
    if kind == "boolop":
        old = type(node.op).__name__
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        return node, f"{old} -> {type(node.op).__name__}"
    if kind == "unary":
        return node.operand, f"drop {type(node.op).__name__}"
    if kind == "const":
        v = node.value
        new = v + 1 if isinstance(v, int) else (1.0 if v == 0 else v * 2)
        node.value = new
        return node, f"{v!r} -> {new!r}"
    if kind == "minmax":
        old = node.func.id
        node.func.id = "max" if old == "min" else "min"
        return node, f"{old}() -> {node.func.id}()"
    old = node.func.attr
    node.func.attr = _METHOD_SWAP[old]
    return node, f".{old}() -> .{node.func.attr}()"


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, new: ast.AST) -> None:
        self.target, self.new = target, new

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            return self.new
        return super().generic_visit(node)


def generate(module: str) -> list[Mutant]:
    """Every generated mutant of `module` (inside its `TARGETS` functions)."""
    text = (ROOT / module).read_text(encoding="utf-8")
    funcs, _ = TARGETS[module]
    base = ast.parse(text)
    out = []
    for fname in funcs:
        # module-level assignments ("*") or one function
        def roots(tree: ast.Module, fname: str = fname) -> list[ast.AST]:
            if fname == "*":
                return [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))]
            scope = _scopes(tree).get(fname)
            if scope is None:
                raise SystemExit(f"{module}: no function {fname!r} (update TARGETS)")
            return [scope]

        n_cand = sum(len(_candidates(r, _skipped(base))) for r in roots(base))
        for i in range(n_cand):
            tree = copy.deepcopy(base)
            skip = _skipped(tree)
            cands = [c for r in roots(tree) for c in _candidates(r, skip)]
            node, kind = cands[i]
            line = getattr(node, "lineno", 0)
            new, what = _mutate(node, kind)
            if new is not node:
                tree = _Replace(node, new).visit(tree)
            ast.fix_missing_locations(tree)
            out.append(Mutant(module, fname, line, what, ast.unparse(tree)))
    return out


def hand_mutants(modules: set[str]) -> tuple[list[Mutant], list[tuple[str, str]]]:
    """The `HAND` mutants of `modules`, and (name, module) of those whose text is not in the code any more."""
    out, stale = [], []
    for name, module, old, new in HAND:
        if module not in modules:
            continue
        text = (ROOT / module).read_text(encoding="utf-8")
        if text.count(old) != 1:
            stale.append((name, module))
            continue
        line = text[: text.index(old)].count("\n") + 1
        out.append(Mutant(module, "-", line, name, text.replace(old, new), hand=True))
    return out, stale


# ---------------------------------------------------------------- running
def make_copy() -> Path:
    """A temporary copy of the repository's package, tests and data (no bytecode caches, no .venv)."""
    tmp = Path(tempfile.mkdtemp(prefix="mlalab-mutate-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")
    for part in ("mlalab", "tests", "data", "notebooks"):
        shutil.copytree(ROOT / part, tmp / part, ignore=ignore)
    for f in ("pyproject.toml", "environment.yml", "README.md"):
        shutil.copy2(ROOT / f, tmp / f)
    shutil.copytree(ROOT / "docs", tmp / "docs", ignore=ignore)
    shutil.copytree(ROOT / "experiments", tmp / "experiments", ignore=ignore)
    return tmp


def run_tests(tmp: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, str]:
    """Run `tests` on the copy in a forked child (package imported fresh there); (status, first failing test)."""
    report = tmp / ".mutate_first_failure"
    report.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # child
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)  # the run's own log stays readable
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest
            import torch

            torch.set_num_threads(1)
            os.chdir(tmp)
            sys.path[:0] = [str(tmp), str(tmp / "tests")]

            class Plugin:
                def pytest_runtest_logreport(self, report):  # noqa: ANN001, ANN201
                    if report.failed and not (tmp / ".mutate_first_failure").exists():
                        (tmp / ".mutate_first_failure").write_text(report.nodeid)

            rc = pytest.main([*tests, "-x", "-q", "-m", FAST, "-p", "no:cacheprovider", "--no-header", "-p",
                              "no:randomly", "-W", "ignore"], plugins=[Plugin()])  # fmt: skip
            os._exit(int(rc))
        except BaseException:  # noqa: BLE001
            os._exit(99)
    t0 = time.time()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "killed (timeout)", ""
        time.sleep(0.05)
    rc = os.waitstatus_to_exitcode(status)
    first = report.read_text() if report.exists() else ""
    if rc == 0:
        return "survived", ""
    if rc == 5:
        return "no tests", ""
    return "killed", first or f"exit {rc}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", nargs="*", default=list(GROUPS), help=f"groups: {', '.join(GROUPS)}")
    ap.add_argument(
        "--files", nargs="*", default=None, help="module paths instead of --modules (e.g. mlalab/traffic.py)"
    )
    ap.add_argument("--hand-only", action="store_true", help="only the hand-written mutants")
    ap.add_argument(
        "--functions", nargs="*", default=None, help="only the generated mutants in these TARGETS functions"
    )
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=float, default=0, help="seconds per mutant (default: 4 x the clean run)")
    ap.add_argument("--out", default="", help="CSV of every mutant's result")
    args = ap.parse_args()
    unknown = set(args.modules) - set(GROUPS)
    if unknown:
        raise SystemExit(f"unknown --modules {sorted(unknown)}; valid: {', '.join(GROUPS)}")
    modules = {m for g in args.modules for m in GROUPS[g]}
    if args.files is not None:
        bad = set(args.files) - set(TARGETS)
        if bad:
            raise SystemExit(f"unknown --files {sorted(bad)}; valid: {', '.join(TARGETS)}")
        modules = set(args.files)
    mutants, stale = hand_mutants(modules)
    if not args.hand_only:
        for m in sorted(modules):
            mutants += generate(m)
    if args.functions is not None:
        known = {f for m in modules for f in TARGETS[m][0]}
        if set(args.functions) - known:
            raise SystemExit(f"unknown --functions {sorted(set(args.functions) - known)}; valid: {', '.join(known)}")
        mutants, stale = [m for m in mutants if m.function in args.functions], []
    for name, module in stale:
        print(f"INVALID (text not found, update HAND): {module}: {name}")
    if args.list:
        for m in mutants:
            print(f"{m.module}:{m.line} {m.function} {m.what}{' [hand]' if m.hand else ''}")
        print(f"{len(mutants)} mutants")
        return

    sys.dont_write_bytecode = True  # a mutated module of the same size in the same second must not hit a stale .pyc
    import pytest  # noqa: F401  (imported once here; children inherit it)
    import torch  # noqa: F401

    tmp = make_copy()
    rows = [{"module": m, "function": "-", "line": 0, "mutation": n, "hand": 1, "status": "invalid",
             "first_failure": ""} for n, m in stale]  # fmt: skip
    try:
        clean: dict[str, float] = {}
        for module in sorted(modules):  # every test set must pass on the unmutated code (else nothing is measured)
            t0 = time.time()
            status, first = run_tests(tmp, TARGETS[module][1], 3600)
            clean[module] = time.time() - t0
            if status != "survived":
                raise SystemExit(f"the tests of {module} fail on the unmutated code: {first}")
            print(f"clean {module}: {clean[module]:.1f} s", flush=True)
        for i, m in enumerate(mutants, 1):
            path = tmp / m.module
            original = path.read_text(encoding="utf-8")
            try:
                compile(m.source, m.module, "exec")
            except SyntaxError as e:
                rows.append({**_row(m), "status": "invalid", "first_failure": f"SyntaxError: {e}"})
                continue
            path.write_text(m.source, encoding="utf-8")
            try:
                timeout = args.timeout or max(30.0, 4 * clean[m.module])
                status, first = run_tests(tmp, TARGETS[m.module][1], timeout)
            finally:
                path.write_text(original, encoding="utf-8")
            rows.append({**_row(m), "status": status, "first_failure": first})
            _write(args.out, rows)  # after every mutant: a stopped run keeps what it measured
            print(f"[{i}/{len(mutants)}] {status:17s} {m.module}:{m.line} {m.function} {m.what}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write(args.out, rows)
    surv = [r for r in rows if r["status"] == "survived"]
    killed = sum(r["status"].startswith("killed") for r in rows)
    print(f"\n{len(rows)} mutants: {killed} killed, {len(surv)} survived, "
          f"{sum(r['status'] == 'invalid' for r in rows)} invalid")  # fmt: skip
    for r in surv:
        print(f"SURVIVED {r['module']}:{r['line']} {r['function']} {r['mutation']}")


def _write(out: str, rows: list[dict]) -> None:
    """The CSV, written whole to a side file and renamed: never half a file."""
    if not out or not rows:
        return
    part = f"{out}.part"
    with open(part, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["module", "function", "line", "mutation", "hand", "status", "first_failure"])
        w.writeheader()
        w.writerows(rows)
    os.replace(part, out)


def _row(m: Mutant) -> dict:
    return {"module": m.module, "function": m.function, "line": m.line, "mutation": m.what, "hand": int(m.hand)}


if __name__ == "__main__":
    main()
