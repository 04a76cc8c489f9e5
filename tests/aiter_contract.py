"""aiter's real signatures, read from its Python sources with `ast` (aiter is never imported), and the check that a
keyword call of the backend binds to them.

Two kinds of source feed it:

* the ``amd-aiter`` wheel the package index serves (`aiter_fp4.AITER_VERSION`, fetched by `aiter_fp4.fetch_wheel`):
  `wheel_signatures` reads ``aiter/ops/attention.py``, ``aiter/mla.py`` and the pybind11 argument lists of
  ``aiter_meta/csrc/include/rocm_ops.hpp`` straight from the zip;
* snapshots of tagged releases of ROCm/aiter (``tests/aiter_signatures.json``): the same reader applied to the files
  at each tag. Regenerate with
  ``python tests/aiter_contract.py <a ROCm/aiter git clone> > tests/aiter_signatures.json``.

How an aiter call reaches its kernel (the rule `check_call` applies): a function decorated with ``@compile_ops`` (a
pybind11 module, not ``ffi_type="ctypes"``) is registered as a torch custom op whose schema is the Python stub's
signature; torch hands the bound arguments to aiter's wrapper *positionally*, which passes them on positionally to the
pybind11 function. So a keyword binds by the stub's name, but the C++ parameter it lands in is the pybind11 argument at
the same position. Where the two lists disagree (``get_mla_metadata_v1`` up to 0.1.7.post2 lists ``work_indptr,
work_info`` while its binding takes ``work_info_set, work_indptr``), the position decides. Pure-Python functions and
ctypes-bound ones bind by their own parameter names.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (function, file in the aiter tree) for every function the backend calls.
FUNCTIONS = (
    ("get_mla_metadata_info_v1", "aiter/ops/attention.py"),
    ("get_mla_metadata_v1", "aiter/ops/attention.py"),
    ("mla_decode_stage1_asm_fwd", "aiter/ops/attention.py"),
    ("mla_reduce_v1", "aiter/ops/attention.py"),
    ("mla_decode_fwd", "aiter/mla.py"),
)
BINDINGS = "csrc/include/rocm_ops.hpp"  # in the wheel: aiter_meta/csrc/include/rocm_ops.hpp

#: The names one value goes by across the five functions, their releases, and a stub and its binding.
ROLE_NAMES = {
    "work_metadata": ("work_meta_data", "work_metadata", "work_metadata_ptrs"),
    "work_info_set": ("work_info_set", "work_info"),
    "qo_indptr": ("qo_indptr", "seqlens_qo_indptr"),
    "kv_indptr": ("kv_indptr", "seqlens_kv_indptr"),
    "kv_indices": ("kv_page_indices", "kv_indices"),
    "q": ("Q", "q"),
    "kv_buffer": ("KV", "kv_buffer"),
    "out": ("output", "o", "final_output"),
    "final_lse": ("lse", "final_lse"),
    "logits": ("splitData", "partial_output"),
    "attn_lse": ("splitLse", "partial_lse"),
}

#: Defaults we may leave to aiter: values that switch nothing on. Any other default a call leaves out is a finding.
NEUTRAL_DEFAULTS = {"None", "-1", "False", "0", "0.0", "1"}


@dataclass(frozen=True)
class Role:
    """A stand-in value that says which parameter it is meant for (its `role`, a C++/Python parameter name)."""

    role: str

    def __repr__(self) -> str:
        return f"<{self.role}>"


def _param_list(fn: ast.FunctionDef) -> list[list[Any]]:
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out: list[list[Any]] = [[p.arg, "pos", None if d is None else ast.unparse(d)] for p, d in zip(pos, defaults)]
    if a.vararg:
        out.append([a.vararg.arg, "varargs", None])
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append([p.arg, "kwonly", None if d is None else ast.unparse(d)])
    if a.kwarg:
        out.append([a.kwarg.arg, "varkw", None])
    return out


def _compile_ops(fn: ast.FunctionDef) -> dict[str, Any] | None:
    """The ``@compile_ops(...)`` decorator's keywords (fc_name, ffi_type), or None when undecorated."""
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", "")) == "compile_ops":
            kw = {k.arg: ast.literal_eval(k.value) for k in d.keywords if k.arg in ("fc_name", "ffi_type")}
            return {"fc_name": kw.get("fc_name"), "ffi_type": kw.get("ffi_type")}
    return None


def pybind_args(rocm_ops: str, name: str) -> list[str] | None:
    """The ``py::arg("...")`` names of ``m.def("<name>", ...)`` in rocm_ops.hpp, in order (None if not defined)."""
    m = re.search(r'm\.def\(\s*"' + re.escape(name) + r'"(.*?)\)\s*;', rocm_ops, re.S)
    if m is None:
        return None
    return re.findall(r'py::arg\("([A-Za-z_0-9]+)"\)', m.group(1))


def read_signatures(sources: dict[str, str], rocm_ops: str | None) -> dict[str, Any]:
    """{function: {"params": [[name, kind, default source or None]], "binding": pybind names or None,
    "via": "python" | "pybind" | "ctypes"}} for `FUNCTIONS`, from the text of their files."""
    out: dict[str, Any] = {}
    trees = {path: ast.parse(text) for path, text in sources.items()}
    for name, path in FUNCTIONS:
        defs = [n for n in trees[path].body if isinstance(n, ast.FunctionDef) and n.name == name]
        if not defs:
            out[name] = None
            continue
        fn = defs[-1]
        deco = _compile_ops(fn)
        via, binding = "python", None
        if deco is not None:
            via = "ctypes" if deco["ffi_type"] == "ctypes" else "pybind"
            if via == "pybind" and rocm_ops is not None:
                binding = pybind_args(rocm_ops, deco["fc_name"] or name)
        out[name] = {"params": _param_list(fn), "binding": binding, "via": via}
    return out


def wheel_signatures(wheel: Path) -> dict[str, Any]:
    """`read_signatures` of the files inside an amd-aiter wheel."""
    with zipfile.ZipFile(wheel) as z:
        sources = {path: z.read(path).decode("utf-8") for path in {p for _, p in FUNCTIONS}}
        names = set(z.namelist())
        ops = z.read("aiter_meta/" + BINDINGS).decode("utf-8") if "aiter_meta/" + BINDINGS in names else None
    return read_signatures(sources, ops)


def wheel_function_source(wheel: Path, name: str, path: str = "aiter/ops/attention.py") -> str:
    """The source text of one top-level function of the wheel (for running its arithmetic)."""
    with zipfile.ZipFile(wheel) as z:
        text = z.read(path).decode("utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise LookupError(f"{path} in {wheel.name} defines no {name}")


def signature_of(entry: dict[str, Any]) -> inspect.Signature:
    P = inspect.Parameter
    kinds = {"pos": P.POSITIONAL_OR_KEYWORD, "kwonly": P.KEYWORD_ONLY}
    kinds.update(varargs=P.VAR_POSITIONAL, varkw=P.VAR_KEYWORD)
    params = []
    for name, kind, default in entry["params"]:
        d = P.empty if default is None or kinds[kind] in (P.VAR_POSITIONAL, P.VAR_KEYWORD) else default
        params.append(P(name, kinds[kind], default=d))
    return inspect.Signature(params)


def check_call(fn: str, entry: dict[str, Any] | None, kwargs: dict[str, Any], allowed_defaults=()) -> list[str]:
    """Problems with calling `fn` (described by `entry`, from `read_signatures`) with keyword arguments `kwargs`.

    * every keyword must bind to the Python signature, and every parameter left out must have a default;
    * a `Role` value must land in a parameter of its role: the pybind11 argument at its position when the call is
      forwarded positionally (``via == "pybind"``), else the parameter it binds to;
    * a default left to aiter must be neutral (`NEUTRAL_DEFAULTS`) or named in `allowed_defaults`."""
    if entry is None:
        return [f"{fn}: not defined in this release"]
    sig = signature_of(entry)
    try:
        bound = sig.bind(**kwargs)
    except TypeError as e:
        return [f"{fn}: {e}"]
    problems = []
    names = [p[0] for p in entry["params"]]
    binding = entry["binding"] if entry["via"] == "pybind" else None
    if entry["via"] == "pybind" and binding is None:
        problems.append(f"{fn}: compiled through pybind11 but its argument list was not found")
    for key, value in bound.arguments.items():
        if not isinstance(value, Role):
            continue
        slot = key
        if binding is not None:
            i = names.index(key)
            slot = binding[i] if i < len(binding) else f"<position {i} beyond the binding>"
        if slot not in ROLE_NAMES.get(value.role, (value.role,)):
            problems.append(f"{fn}: the value meant for {value.role!r} (passed as {key!r}) reaches {slot!r}")
    if binding is not None:
        passed = {names.index(k) for k in bound.arguments}
        for i, (stub, bind) in enumerate(zip(names, binding)):
            if i in passed and stub != bind and not isinstance(bound.arguments[stub], Role):
                problems.append(f"{fn}: {stub!r} reaches the binding's {bind!r}")
    for name, kind, default in entry["params"]:
        if name in bound.arguments or kind in ("varargs", "varkw"):
            continue
        if default not in NEUTRAL_DEFAULTS and name not in allowed_defaults:
            problems.append(f"{fn}: left {name}={default} to aiter's default")
    return problems


def snapshot_repository(repo: Path, tags: list[str]) -> dict[str, Any]:
    """`read_signatures` at each tag of a ROCm/aiter git clone: {tag: {"commit", "functions"}}."""

    def show(tag: str, path: str) -> str | None:
        r = subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    out = {}
    for tag in tags:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-list", "-n1", tag], capture_output=True, text=True, check=True
        ).stdout.strip()
        sources = {path: show(tag, path) or "" for path in {p for _, p in FUNCTIONS}}
        out[tag] = {"commit": commit, "functions": read_signatures(sources, show(tag, BINDINGS))}
    return out


_RELEASE_TAG = re.compile(r"^v0\.1\.(\d+)(\.post\d+)?$")


def release_tags(repo: Path, first: int = 7, last: int = 20) -> list[str]:
    """The release tags v0.1.<first> ... v0.1.<last>.postN of a clone (no rc, dev or branch-named tags)."""
    tags = subprocess.run(["git", "-C", str(repo), "tag"], capture_output=True, text=True, check=True).stdout.split()
    keep = [t for t in tags if (m := _RELEASE_TAG.match(t)) and first <= int(m.group(1)) <= last]

    def key(t: str) -> tuple[int, int]:
        m = _RELEASE_TAG.match(t)
        assert m
        return int(m.group(1)), int((m.group(2) or ".post0")[5:])

    return sorted(keep, key=key)


def compact(tags: dict[str, Any]) -> dict[str, Any]:
    """One copy of each distinct signature: {"signatures": {"fn@tag": entry}, "tags": {tag: {"commit", "functions":
    {fn: key}}}} (the key names the first tag with that signature)."""
    sigs: dict[str, Any] = {}
    seen: dict[str, str] = {}
    out = {}
    for tag, v in tags.items():
        fns = {}
        for fn, entry in v["functions"].items():
            text = json.dumps(entry, sort_keys=True)
            if text not in seen:
                seen[text] = f"{fn}@{tag}"
                sigs[seen[text]] = entry
            fns[fn] = seen[text]
        out[tag] = {"commit": v["commit"], "functions": fns}
    return {"signatures": sigs, "tags": out}


def load_snapshots(path: Path) -> dict[str, Any]:
    """{tag: {"commit": sha, "functions": {fn: entry}}} from a file written by this module."""
    data = json.loads(path.read_text(encoding="utf-8"))
    sigs = data["signatures"]
    return {
        tag: {"commit": v["commit"], "functions": {fn: sigs[key] for fn, key in v["functions"].items()}}
        for tag, v in data["tags"].items()
    }


if __name__ == "__main__":
    clone = Path(sys.argv[1])
    data = {
        "about": "signatures of the functions mlalab's aiter backend calls, read with tests/aiter_contract.py "
        "(read_signatures) from ROCm/aiter at each release tag: aiter/ops/attention.py, aiter/mla.py and the "
        "pybind11 argument lists of csrc/include/rocm_ops.hpp. Each entry: params [name, kind, default source], "
        "via (python | pybind | ctypes), binding (pybind11 argument names, in order).",
        "source": "https://github.com/ROCm/aiter",
        **compact(snapshot_repository(clone, release_tags(clone))),
    }
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")
