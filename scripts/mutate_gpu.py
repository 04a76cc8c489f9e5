"""Mutation testing of the GPU kernels: does the GPU suite catch a small deliberate bug in the sm_90 (Gluon) and
portable (Triton) kernels?

Each mutant of `MUTANTS` (issue 33's two log2(e) cases and a few more) is applied to a temporary copy of the
repository (never to this checkout); the copy's GPU tests of that kernel then run on it (``-m gpu``, first failure
stops). A mutant is *killed* (a test failed, or the run timed out), *survived* (every test passed: a hole in the
suite) or *invalid* (its text is not in the code any more: update `MUTANTS`). The unmutated copy runs first; if its
tests fail nothing is measured.

On the H200 (from the repository root). A killed mutant stops at its first failing test (seconds to a minute); a
survivor runs the whole GPU file (minutes). A device call is limited to 10 min, so run a few mutants per call:

    python scripts/mutate_gpu.py --only stage1-no-log2e reduce-no-log2e --out $OUT/mutate_gpu_1.csv
    python scripts/mutate_gpu.py --no-clean --only epilogue-lse-base2 stage1-no-rescale --out $OUT/mutate_gpu_2.csv

Without a GPU, ``--dry-run`` checks every mutant on the CPU instead: its patch applies, the module still compiles,
and the mutated kernel still builds for sm_90 (Gluon: `mlalab.kernels.sm90.build`, ptxas from Triton's wheel) with
SASS that differs from the unmutated kernel's (the mutation reaches the machine code). ``--cpu-tests`` adds the CPU
interpreter tests for the portable kernel's mutants (slow: minutes each).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SM90_TESTS = ("tests/test_sm90_kernel.py",)
PORTABLE_TESTS = ("tests/test_triton_kernels.py",)
FP4_TESTS = ("tests/test_fp4_kernels.py",)

#: name -> (module, exact text, replacement, what it breaks, the GPU tests that must catch it, CPU build check)
#: build check: ("stage1", paths) compiles stage 1 on those paths, ("stage1-rows", rows) the fp8 path with that many
#: q rows a CTA, ("stage1-causal", rows) the same under the causal mask, ("reduce", max_partials) the Gluon reduce,
#: ("triton-reduce", max_partials) the Triton reduce, None: none (portable stage 1 is checked by the interpreter).
MUTANTS: dict[str, tuple[str, str, str, str, tuple[str, ...], tuple | None]] = {
    "stage1-no-log2e": (
        "mlalab/kernels/sm90/stage1.py",
        "qk_scale = sm_scale * q_scale * v_scale * 1.4426950408889634",
        "qk_scale = sm_scale * q_scale * v_scale",
        "sm_90 stage 1 softmax without its log2(e) factor (scale x 0.69)",
        SM90_TESTS, ("stage1", ("v-regs", "v-tile", "v-conv")),
    ),
    "reduce-no-log2e": (
        "mlalab/kernels/sm90/reduce.py",
        "wgt = gl.exp2(lp * LOG2E - (m_safe * LOG2E)[None, :])",
        "wgt = gl.exp2(lp - m_safe[None, :])",
        "Gluon reduce: merge weights without log2(e)",
        SM90_TESTS, ("reduce", (2, 64)),
    ),
    "reduce-online-no-log2e": (
        "mlalab/kernels/sm90/reduce.py",
        "c = gl.exp2((m - m_ref) * LOG2E)\n        c_b = gl.exp2((m_b - m_ref) * LOG2E)",
        "c = gl.exp2(m - m_ref)\n        c_b = gl.exp2(m_b - m_ref)",
        "Gluon reduce: the online merge of further blocks of partials (> BLOCK_P) without log2(e)",
        SM90_TESTS, ("reduce", (64, 200)),
    ),
    "epilogue-lse-base2": (
        "mlalab/kernels/sm90/epilogue.py",
        "(m_i + _lg2_approx(l_safe)) * 0.6931471805599453",
        "(m_i + _lg2_approx(l_safe))",
        "sm_90 epilogue: the LSE left in base 2 (wrong LSE, and wrong merge weights for split requests)",
        SM90_TESTS, ("stage1", ("v-regs", "v-tile")),
    ),
    "stage1-no-rescale": (
        "mlalab/kernels/sm90/stage1.py",
        "alpha = gl.exp2(m_i - m_new)",
        "alpha = gl.exp2(m_new - m_new)",
        "sm_90 stage 1: the running sum and output not rescaled when the max grows (online softmax broken)",
        SM90_TESTS, ("stage1", ("v-regs", "v-tile", "v-conv")),
    ),
    "stage1-alpha-parity": (
        "mlalab/kernels/sm90/stage1.py",
        "alpha = a_smem.index(pb).load(",
        "alpha = a_smem.index(1 - pb).load(",
        "sm_90 stage 1 on two warpgroups (q_len 2, 4): every column's rescale factor read from the other tile's buffer",
        SM90_TESTS, ("stage1-rows", (2, 4)),
    ),
    "stage1-causal-one-late": (
        "mlalab/kernels/sm90/stage1.py",
        "col_end = gl.minimum(kv_end, gl.load(info + 7) - col_back)",
        "col_end = gl.minimum(kv_end, gl.load(info + 7) - col_back + 1)",
        "sm_90 stage 1, q rows side by side under the causal mask: every row but the last sees one token too many",
        SM90_TESTS, ("stage1-causal", (2, 4)),
    ),
    "portable-no-log2e": (
        "mlalab/kernels/portable.py",
        "qk_scale = sm_scale * tl.load(Q_SCALE) * tl.load(KV_SCALE) * 1.4426950408889634",
        "qk_scale = sm_scale * tl.load(Q_SCALE) * tl.load(KV_SCALE)",
        "portable stage 1 softmax without log2(e)",
        PORTABLE_TESTS, None,
    ),
    "triton-reduce-no-log2e": (
        "mlalab/kernels/portable.py",
        "wgt = tl.exp2(lp * log2e - (m_safe * log2e)[None, :])",
        "wgt = tl.exp2(lp - m_safe[None, :])",
        "Triton reduce (portable path and the sm_90 bf16 path): merge weights without log2(e)",
        PORTABLE_TESTS + SM90_TESTS, ("triton-reduce", (2, 40)),
    ),
    "e4m3-no-logit-shift": (
        "mlalab/kernels/sm90/stage1.py",
        "sc = s_acc * (qk_scale * col)[:, None] + f_tok.to(gl.float32)[:, None]",
        "sc = s_acc * (qk_scale * col)[:, None]",
        "e4m3 route: P̂ without the token's F in its logit (the residual rows weighted by P, not P · 2^F)",
        FP4_TESTS, ("stage1", ("v-fp4-e4m3",)),
    ),
    "e4m3-sum-unscaled": (
        "mlalab/kernels/sm90/stage1.py",
        "l_acc = l_acc * alpha[None, :] + p * _pow2(-f_tok)[:, None]",
        "l_acc = l_acc * alpha[None, :] + p",
        "e4m3 route: the softmax sum adds P̂ instead of P̂ · 2^-F",
        FP4_TESTS, ("stage1", ("v-fp4-e4m3",)),
    ),
    "e4m3-score-unscaled": (
        "mlalab/kernels/sm90/stage1.py",
        "sc = s_acc * (qk_scale * col)[:, None] + f_tok",
        "sc = s_acc * qk_scale + f_tok",
        "e4m3 route: scores of the residuals, without the token's 2^F",
        FP4_TESTS, ("stage1", ("v-fp4-e4m3",)),
    ),
    "e4m3-window-low": (
        "mlalab/kernels/sm90/fp4tiles.py",
        "[:, None] + E4M3_WINDOW  # j + 5",
        "[:, None] + E4M3_WINDOW - 1  # j + 5",
        "e4m3 route: every residual one binade low (block tables off by one)",
        FP4_TESTS, ("stage1", ("v-fp4-e4m3",)),
    ),
    "e4m3-table-entry": (
        "mlalab/kernels/sm90/fp4tiles.py",
        "_LUT_HI = gl.constexpr(0x24201C18)",
        "_LUT_HI = gl.constexpr(0x24201C1C)",
        "e4m3 route: E2M1 magnitude 4 (code 6) converted as 6 (the block tables' base)",
        FP4_TESTS, ("stage1", ("v-fp4-e4m3",)),
    ),
}  # fmt: skip


def make_copy() -> Path:
    """A temporary copy of the package, its tests and data (no caches)."""
    tmp = Path(tempfile.mkdtemp(prefix="mlalab-mutate-gpu-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")
    for part in ("mlalab", "tests", "data"):
        shutil.copytree(ROOT / part, tmp / part, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def apply(tmp: Path, name: str) -> str | None:
    """Apply mutant `name` to the copy; the original text of its module, or None if the patch does not apply."""
    module, old, new = MUTANTS[name][:3]
    path = tmp / module
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        return None
    path.write_text(text.replace(old, new), encoding="utf-8")
    return text


def _env(tmp: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PYTHONDONTWRITEBYTECODE="1", TRITON_CACHE_DIR=str(cache))  # fmt: skip
    return env


def run_pytest(
    tmp: Path,
    tests: tuple[str, ...],
    marker: str,
    timeout: float,
    extra: tuple[str, ...] = (),
    cache: Path | None = None,
) -> tuple:
    """(status, first failing test or the tail of the output, seconds). `cache`: a Triton cache to keep (shared by
    the runs of one process: Triton keys a kernel by its source, so a mutant never reuses another's binary); by
    default a fresh one, removed after the run."""
    own = cache is None
    cache = Path(tempfile.mkdtemp(prefix="triton-cache-")) if own else cache
    cmd = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider", "-m", marker, "-rf", *extra]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=tmp, env=_env(tmp, cache), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", "", time.time() - t0
    finally:
        if own:
            shutil.rmtree(cache, ignore_errors=True)
    dt = time.time() - t0
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in r.stdout.splitlines() if ln.startswith("FAILED ")]
    if r.returncode == 0:
        return "survived", r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "", dt
    if r.returncode == 5:
        return "no tests", "", dt
    why = next((ln[1:].strip()[:160] for ln in r.stdout.splitlines() if ln.startswith("E ")), "")  # (an OOM shows here)
    first = f"{failed[0]}: {why}" if failed else (r.stdout + r.stderr)[-300:].replace("\n", " | ")
    return "killed", first, dt


_BUILD = """
import hashlib, json, sys
from mlalab.kernels.sm90.build import compile_reduce, compile_stage1, compile_triton_reduce
kind, args = sys.argv[1], json.loads(sys.argv[2])
out = {}
for a in args:
    r = (compile_stage1(a) if kind == "stage1" else compile_stage1("v-regs", rows=a) if kind == "stage1-rows"
         else compile_stage1("v-regs", rows=a, causal=True) if kind == "stage1-causal"
         else compile_reduce(a) if kind == "reduce" else compile_triton_reduce(a))
    out[str(a)] = {"registers": r.registers, "sass": r.sass,
                   "listing": hashlib.sha256(r.listing.encode()).hexdigest()}  # (a changed constant shows here)
print("BUILD " + json.dumps(out))
"""


def build(tmp: Path, check: tuple) -> dict:
    """Compile the kernel(s) of `check` for sm_90 in a fresh process on the copy: {config: registers, SASS mix,
    listing hash}."""
    import json

    cache = Path(tempfile.mkdtemp(prefix="triton-cache-"))
    try:
        r = subprocess.run([sys.executable, "-c", _BUILD, check[0], json.dumps(list(check[1]))], cwd=tmp,
                           env=_env(tmp, cache), capture_output=True, text=True, timeout=900)  # fmt: skip
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("BUILD ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"build failed: {(r.stderr or r.stdout)[-1500:]}")
    return json.loads(line[0][6:])


def dry_run(names: list[str], cpu_tests: bool) -> list[dict]:
    """Apply, compile and build each mutant on the CPU (and optionally run the interpreter tests)."""
    rows = []
    tmp = make_copy()
    try:
        clean_builds: dict[tuple, dict] = {}
        for name in names:
            module, _, _, what, _, check = MUTANTS[name]
            row = {"mutant": name, "module": module, "what": what}
            original = apply(tmp, name)
            if original is None:
                rows.append({**row, "status": "invalid", "detail": "the text is not in the code (update MUTANTS)"})
                print(f"INVALID {name}", flush=True)
                continue
            try:
                compile((tmp / module).read_text(encoding="utf-8"), module, "exec")
                detail = "applies, compiles"
                if check is not None:
                    (tmp / module).write_text(original, encoding="utf-8")
                    key = (check[0], tuple(check[1]))
                    if key not in clean_builds:
                        clean_builds[key] = build(tmp, check)
                    apply(tmp, name)
                    mutated = build(tmp, check)
                    same = [c for c in mutated if mutated[c]["listing"] == clean_builds[key][c]["listing"]]
                    if same:
                        raise RuntimeError(f"the SASS listing of {check[0]} {same} is unchanged: the mutation does not "
                                           "reach the kernel")  # fmt: skip
                    detail += f", builds for sm_90 ({check[0]} {list(check[1])}), SASS changed"
                status = "dry-run ok"
                if cpu_tests and module.endswith("portable.py"):
                    st, first, dt = run_pytest(tmp, ("tests/test_triton_kernels.py",), "not gpu", 3600,
                                               ("-k", "interpreter"))  # fmt: skip
                    status = f"cpu {st}"
                    detail += f"; CPU interpreter tests: {st} {first} ({dt:.0f} s)"
            except Exception as e:  # noqa: BLE001 (recorded: a mutant that does not build is a bad mutant)
                status, detail = "dry-run failed", f"{type(e).__name__}: {e}"
            finally:
                (tmp / module).write_text(original, encoding="utf-8")
            rows.append({**row, "status": status, "detail": detail})
            print(f"{status:15s} {name}: {detail}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def gpu_run(names: list[str], timeout: float, clean: bool = True, k: str = "") -> list[dict]:
    """Each mutant's GPU tests on the H200 (after the unmutated code's, unless `clean` is False)."""
    extra = ("-k", k) if k else ()
    import torch

    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        raise SystemExit("the GPU mutation run needs an sm_90 GPU (H200/H100); use --dry-run on the CPU")
    rows = []
    tmp = make_copy()
    cache = tmp / ".triton-cache"  # shared by this run's mutants: the unmutated kernels compile once
    try:
        for tests in sorted({MUTANTS[n][4] for n in names}) if clean else ():
            st, first, dt = run_pytest(tmp, tests, "gpu", timeout, extra, cache)
            print(f"clean {' '.join(tests)}: {st} ({dt:.0f} s) {first}", flush=True)
            if st != "survived":
                raise SystemExit(f"the GPU tests {tests} fail on the unmutated code: {first}")
        for name in names:
            module, _, _, what, tests, _ = MUTANTS[name]
            original = apply(tmp, name)
            if original is None:
                rows.append({"mutant": name, "module": module, "what": what, "status": "invalid", "detail": ""})
                continue
            try:
                st, first, dt = run_pytest(tmp, tests, "gpu", timeout, extra, cache)
            finally:
                (tmp / module).write_text(original, encoding="utf-8")
            rows.append({"mutant": name, "module": module, "what": what, "status": st,
                         "detail": f"{first} ({dt:.0f} s)"})  # fmt: skip
            print(f"{st:17s} {name}: {first} ({dt:.0f} s)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=list(MUTANTS), help=f"mutants: {', '.join(MUTANTS)}")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: apply, compile and build each mutant")
    ap.add_argument(
        "--cpu-tests", action="store_true", help="with --dry-run: the interpreter tests of portable mutants"
    )
    ap.add_argument("--timeout", type=float, default=540, help="seconds per mutant's GPU test run")
    ap.add_argument("--no-clean", action="store_true", help="skip the run on the unmutated code (it passed already)")
    ap.add_argument("-k", default="", help="pytest -k expression restricting the GPU tests")
    ap.add_argument("--out", default="", help="CSV of the results")
    args = ap.parse_args()
    bad = set(args.only) - set(MUTANTS)
    if bad:
        raise SystemExit(f"unknown mutants {sorted(bad)}; valid: {', '.join(MUTANTS)}")
    rows = (
        dry_run(args.only, args.cpu_tests)
        if args.dry_run
        else gpu_run(args.only, args.timeout, not args.no_clean, args.k)
    )
    if args.out and rows:
        part = f"{args.out}.part"
        with open(part, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        os.replace(part, args.out)
    survived = [r["mutant"] for r in rows if r["status"] == "survived"]
    print(f"\n{len(rows)} mutants; survived: {', '.join(survived) or 'none'}")
    if any(r["status"] in ("invalid", "dry-run failed") for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
