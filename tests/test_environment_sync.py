"""environment.yml (conda) must list exactly the packages pyproject.toml declares (core + every extra)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PYPI = {"pytorch": "torch"}
CONDA_ONLY = {"python", "pip"}


def _conda_name(spec: str) -> str:
    spec = spec.split("::")[-1]
    return canonicalize_name(re.split(r"[\s=<>!~\[,]", spec, maxsplit=1)[0])


def _env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _pyproject_names() -> set[str]:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"]) + [r for extra in proj["optional-dependencies"].values() for r in extra]
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def _env_names() -> set[str]:
    names: set[str] = set()
    for dep in _env()["dependencies"]:
        if isinstance(dep, dict):
            names |= {canonicalize_name(Requirement(p).name) for p in dep.get("pip", []) if not p.startswith("-")}
        else:
            n = _conda_name(dep)
            if n not in CONDA_ONLY:
                names.add(CONDA_TO_PYPI.get(n, n))
    return names


def test_environment_yml_is_well_formed() -> None:
    env = _env()
    assert env["name"] == "mlalab"
    assert env["channels"] == ["conda-forge"]
    assert any(isinstance(d, str) and d.startswith("python") for d in env["dependencies"])
    pip_sections = [d for d in env["dependencies"] if isinstance(d, dict)]
    assert len(pip_sections) == 1 and "-e ." in pip_sections[0]["pip"]


def test_environment_yml_matches_pyproject() -> None:
    py, conda = _pyproject_names(), _env_names()
    assert py - conda == set(), f"missing from environment.yml: {sorted(py - conda)}"
    assert conda - py == set(), f"in environment.yml but not pyproject.toml: {sorted(conda - py)}"


def test_version_bounds_agree() -> None:
    """Where both files pin a lower bound, they must agree (a drift in either is a bug)."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"]) + [r for extra in proj["optional-dependencies"].values() for r in extra]
    py_spec = {canonicalize_name(Requirement(r).name): str(Requirement(r).specifier) for r in reqs}
    for dep in _env()["dependencies"]:
        if not isinstance(dep, str):
            continue
        n = CONDA_TO_PYPI.get(_conda_name(dep), _conda_name(dep))
        if n in py_spec:
            conda_spec = dep[len(re.split(r"[\s=<>!~\[,]", dep, maxsplit=1)[0]) :].strip()
            assert set(conda_spec.split(",")) == set(py_spec[n].split(",")) or not conda_spec, (
                n,
                conda_spec,
                py_spec[n],
            )


def test_h200_copy_bandwidth_is_the_median_of_the_recorded_runs() -> None:
    """config.py's H200 copy bandwidth must be what data/timings measured, not a number typed from elsewhere."""
    import statistics

    import pandas as pd

    from mlalab.config import GPU_TARGETS

    runs = [float(pd.read_csv(p).copy_tbps.median()) for p in sorted((ROOT / "data" / "timings").glob("h200_*.csv"))]
    assert runs, "no recorded H200 runs"
    assert abs(GPU_TARGETS["h200"].copy_tbps - statistics.median(runs)) < 0.01, (GPU_TARGETS["h200"].copy_tbps, runs)


def test_the_rocm_extra_admits_what_pypi_serves_and_mlalab_accepts() -> None:
    """PyPI's only amd-aiter is 0.1.7.post2.dev18, a dev release: pip skips pre-releases unless the specifier names
    one, so `pip install -e ".[rocm]"` found nothing with ">=0.1.7". The extra must admit it (pip's rule), and the
    aiter backend must accept the version it installs."""
    from mlalab.backends.aiter_abi import abi_for_version

    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = [Requirement(r) for r in proj["optional-dependencies"]["rocm"] if Requirement(r).name == "amd-aiter"]
    # pip takes a pre-release only when the specifier itself names one (seen: ">=0.1.7,<0.1.21" -> "No matching
    # distribution found ... (from versions: 0.1.7.post2.dev18)")
    assert req.specifier.prereleases is True and req.specifier.contains("0.1.7.post2.dev18", prereleases=True)
    assert Requirement("amd-aiter>=0.1.7,<0.1.21").specifier.prereleases is not True  # the check can fail
    abi_for_version("0.1.7.post2.dev18")  # accepted (raises for a refused version)
