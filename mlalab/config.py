"""MLA decode constants, the `DecodeCase` description of one decode call, and the GPU target table.

DeepSeek-R1 at TP8 fixes the shapes: 16 query heads per GPU, one latent KV head of 576 dims (512 latent
"NoPE" dims + 64 RoPE dims). With the absorbed query the keys are all 576 dims and the values are the first
512 — the same bytes — so a decode reads each KV token once for all 16 heads (the MQA pattern).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

__all__ = [
    "MLAConfig",
    "MLA",
    "InputDist",
    "DecodeCase",
    "GpuTarget",
    "GPU_TARGETS",
    "get_target",
    "COMPETITION_SHAPES",
    "MIXED_MLA_2026_SHAPES",
]

#: The 12 shapes (batch, kv_len) of the GPU MODE MLA-decode problem the timings are reported on (q_len 1).
COMPETITION_SHAPES = [(b, L) for b in (4, 8, 16, 32, 64, 128) for L in (1024, 8192)]

#: The 8 benchmark shapes (batch, kv_len) of its 2026 successor, GPU MODE ``amd_202602/mixed-mla`` (q_len 1).
MIXED_MLA_2026_SHAPES = [(b, L) for L in (1024, 8192) for b in (4, 32, 64, 256)]


@dataclass(frozen=True)
class MLAConfig:
    """Shape constants of absorbed-MLA decode (DeepSeek-R1, tensor-parallel 8)."""

    num_heads: int = 16
    num_kv_heads: int = 1
    kv_lora_rank: int = 512  # latent dims: the values, and the first 512 key dims
    rope_dim: int = 64  # rotary dims: keys only

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_kv_heads", "kv_lora_rank", "rope_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"MLAConfig.{name} must be a positive int, got {v!r}")

    @property
    def qk_dim(self) -> int:
        """Key / query head dimension (576)."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def v_dim(self) -> int:
        """Value / output head dimension (512)."""
        return self.kv_lora_rank

    @property
    def sm_scale(self) -> float:
        """Softmax scale 1/sqrt(576): the absorbed query keeps the original qk head dim of 192 folded in the
        weights, but DeepSeek's absorbed decode kernels (and the competition) use 1/sqrt(576)."""
        return 1.0 / math.sqrt(self.qk_dim)


MLA = MLAConfig()


class InputDist(enum.StrEnum):
    """Named input distributions for q and the KV buffer."""

    COMPETITION = "competition"  # randn * 0.02 in bf16 (the competition's generator)
    UNIT = "unit"  # randn (std 1), the "mixed-mla" variant without * 0.02
    OUTLIERS = "outliers"  # randn * scale with a few channels multiplied by `outlier_magnitude`
    HEAVY_TAIL = "heavy-tail"  # Student-t (3 degrees of freedom) * scale

    @classmethod
    def parse(cls, name: str | InputDist) -> InputDist:
        if isinstance(name, InputDist):
            return name
        try:
            return cls(name)
        except ValueError:
            valid = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown input distribution {name!r}; valid: {valid}") from None

    @property
    def default_scale(self) -> float:
        return 1.0 if self is InputDist.UNIT else 0.02


@dataclass(frozen=True)
class DecodeCase:
    """One decode call: per-request KV lengths, query length, input distribution and seed.

    Args:
        kv_lens: number of KV tokens of each request (the batch size is its length). 0 is allowed only
            where a caller opts in (see `reference.decode_reference(empty_policy=...)`).
        q_len: query tokens per request: 1 for plain decode, 2 or 4 for speculative decode (every query
            token sees all of its request's KV, as in the competition, unless `causal`).
        causal: speculative verification's mask: q row i of a request with n KV tokens and q rows sees its first
            ``n - (q - 1 - i)`` tokens (the draft tokens' own KV are the request's newest; aiter's `causal`,
            FlashMLA's `causal`). Needs every non-empty request to hold at least q_len tokens.
        seed: seed of the torch CPU generator that draws q and kv.
        dist: input distribution name (see `InputDist`).
        scale: standard deviation multiplier; None means the distribution's default (0.02, or 1 for "unit").
        outlier_magnitude: factor applied to the outlier channels of the "outliers" distribution.
        outlier_channels: how many of the 576 channels are outliers.
        page_size: KV page size (1 = token-granular, as aiter's persistent decode uses).
        permute_pages: shuffle the physical page order (exercises the page table).
        pool_factor: the KV buffer holds this many times the pages the batch uses (a serving engine's pool); with
            `permute_pages` the used pages are a random subset of it, the others stay zero.
    """

    kv_lens: tuple[int, ...]
    q_len: int = 1
    seed: int = 0
    dist: InputDist = InputDist.COMPETITION
    scale: float | None = None
    outlier_magnitude: float = 20.0
    outlier_channels: int = 8
    page_size: int = 1
    permute_pages: bool = False
    pool_factor: int = 1
    causal: bool = False
    config: MLAConfig = field(default=MLA)

    def __post_init__(self) -> None:
        kv = tuple(self.kv_lens) if not isinstance(self.kv_lens, tuple) else self.kv_lens
        object.__setattr__(self, "kv_lens", kv)
        object.__setattr__(self, "dist", InputDist.parse(self.dist))
        if len(kv) == 0:
            raise ValueError("DecodeCase.kv_lens must name at least one request")
        for i, n in enumerate(kv):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"DecodeCase.kv_lens[{i}] must be a non-negative int, got {n!r}")
        if not isinstance(self.q_len, int) or isinstance(self.q_len, bool) or not 1 <= self.q_len <= 16:
            raise ValueError(f"DecodeCase.q_len must be an int in [1, 16] (decode: 1, 2 or 4), got {self.q_len!r}")
        if not isinstance(self.seed, int):
            raise TypeError(f"DecodeCase.seed must be an int, got {type(self.seed).__name__}")
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"DecodeCase.scale must be a positive finite float or None, got {self.scale!r}")
        if not isinstance(self.outlier_magnitude, (int, float)) or not (
            math.isfinite(self.outlier_magnitude) and self.outlier_magnitude > 0
        ):
            raise ValueError(f"DecodeCase.outlier_magnitude must be positive and finite, got {self.outlier_magnitude}")
        if not isinstance(self.config, MLAConfig):
            raise TypeError(f"DecodeCase.config must be an MLAConfig, got {type(self.config).__name__}")
        if not isinstance(self.permute_pages, bool):
            raise TypeError(f"DecodeCase.permute_pages must be a bool, got {self.permute_pages!r}")
        if isinstance(self.pool_factor, bool) or not isinstance(self.pool_factor, int) or self.pool_factor < 1:
            raise ValueError(f"DecodeCase.pool_factor must be an int >= 1, got {self.pool_factor!r}")
        if isinstance(self.outlier_channels, bool) or not isinstance(self.outlier_channels, int):
            raise TypeError(f"DecodeCase.outlier_channels must be an int, got {self.outlier_channels!r}")
        if not (0 <= self.outlier_channels <= self.config.qk_dim):
            raise ValueError(f"DecodeCase.outlier_channels must be in [0, {self.config.qk_dim}]")
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"DecodeCase.page_size must be a positive int, got {self.page_size!r}")
        if not isinstance(self.causal, bool):
            raise TypeError(f"DecodeCase.causal must be a bool, got {self.causal!r}")
        if self.causal:
            for i, n in enumerate(kv):
                if 0 < n < self.q_len:
                    raise ValueError(
                        f"DecodeCase.kv_lens[{i}] = {n} is shorter than q_len {self.q_len} with causal=True: its first "
                        "q row would see no token"
                    )

    @classmethod
    def uniform(cls, batch: int, kv_len: int, **kw: object) -> DecodeCase:
        """`batch` requests of `kv_len` tokens each (the competition's shapes)."""
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if not isinstance(kv_len, int) or kv_len < 1:
            raise ValueError(f"kv_len must be a positive int, got {kv_len!r}")
        return cls(kv_lens=(kv_len,) * batch, **kw)  # type: ignore[arg-type]

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    @property
    def total_q(self) -> int:
        return self.batch * self.q_len

    @property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @property
    def std(self) -> float:
        return self.dist.default_scale if self.scale is None else float(self.scale)

    def short_str(self) -> str:
        lens = self.kv_lens
        kv = f"L{lens[0]}" if len(set(lens)) == 1 else f"ragged{min(lens)}-{max(lens)}"
        causal = "c" if self.causal else ""
        return f"B{self.batch}-{kv}-q{self.q_len}{causal}-{self.dist.value}-s{self.seed}"


@dataclass(frozen=True)
class GpuTarget:
    """A GPU the planners and bandwidth floors are computed for.

    `hbm_tbps` is the datasheet peak; `copy_tbps` is a measured device-to-device copy bandwidth where we
    measured one (None otherwise). `fp8_max` is the largest finite value of the native fp8 e4m3 flavour.
    """

    name: str
    arch: str
    num_cus: int
    fp8_flavour: str  # "e4m3fn" or "e4m3fnuz"
    fp8_max: float
    hbm_tbps: float
    copy_tbps: float | None = None
    copy_source: str = ""
    vendor: str = ""

    def __post_init__(self) -> None:
        if self.num_cus < 1:
            raise ValueError(f"GpuTarget.num_cus must be >= 1, got {self.num_cus}")
        if self.fp8_flavour not in ("e4m3fn", "e4m3fnuz"):
            raise ValueError(f"GpuTarget.fp8_flavour must be e4m3fn or e4m3fnuz, got {self.fp8_flavour!r}")

    @property
    def bandwidth_tbps(self) -> float:
        """Bandwidth used for floors: the measured copy bandwidth when we have one, else the datasheet."""
        return self.copy_tbps if self.copy_tbps is not None else self.hbm_tbps

    @property
    def bandwidth_label(self) -> str:
        if self.copy_tbps is not None:
            return f"{self.copy_tbps:.2f} TB/s measured copy ({self.copy_source})"
        return f"{self.hbm_tbps:.2f} TB/s datasheet peak (not measured here)"


GPU_TARGETS: dict[str, GpuTarget] = {
    "mi300x": GpuTarget("MI300X", "gfx942", 304, "e4m3fnuz", 240.0, 5.3, vendor="AMD"),
    "mi355x": GpuTarget("MI355X", "gfx950", 256, "e4m3fn", 448.0, 8.0, vendor="AMD"),
    "h200": GpuTarget(
        "H200",
        "sm90",
        132,
        "e4m3fn",
        448.0,
        4.8,
        # the median of the device-to-device copy bandwidth measured in the recorded H200 runs (data/timings/*.csv,
        # column copy_tbps; a test keeps it equal to that median)
        copy_tbps=4.08,
        copy_source="median of the copy measurements recorded in data/timings on the H200",
        vendor="NVIDIA",
    ),
}


def get_target(name_or_cus: str | int | GpuTarget) -> GpuTarget:
    """Look up a target by name (mi300x, mi355x, h200, gfx942, gfx950, sm90) or build a generic one from a
    CU count (for "what if" planning; fp8 e4m3fn, bandwidth unknown -> H200's datasheet is NOT assumed)."""
    if isinstance(name_or_cus, GpuTarget):
        return name_or_cus
    if isinstance(name_or_cus, bool):
        raise TypeError("target must be a name or a CU count, not a bool")
    if isinstance(name_or_cus, int) or (isinstance(name_or_cus, str) and name_or_cus.strip().lstrip("+-").isdigit()):
        n = int(name_or_cus)
        if n < 1:
            raise ValueError(f"a target's CU count must be >= 1, got {n}")
        return GpuTarget(f"{n} CUs", "generic", n, "e4m3fn", 448.0, float("nan"), vendor="generic")
    if not isinstance(name_or_cus, str):
        raise TypeError(f"target must be a name or a CU count, got {type(name_or_cus).__name__}")
    key = name_or_cus.strip().lower()
    for k, t in GPU_TARGETS.items():
        if key in (k, t.arch.lower(), t.name.lower()):
            return t
    valid = ", ".join(list(GPU_TARGETS) + [t.arch for t in GPU_TARGETS.values()])
    raise ValueError(f"unknown GPU target {name_or_cus!r}; valid: {valid}, or a positive CU count")
