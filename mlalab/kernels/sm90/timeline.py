"""What each CTA of the persistent sm_90 stage 1 did, and when: a measured Gantt chart of a `WorkPlan` on the GPU.

The sm_90 stage 1 (`stage1.stage1_kernel`) stamps, when compiled with ``TIMELINE=True``, the GPU's nanosecond timer
at each CTA's start and end, and the SM's cycle counter at the start, once the first TMAs are in flight, and per KV
tile when it has arrived, when its scores are done and when its PV is issued, and once each work's output is stored
(`stage1.TIMELINE_COLS`).
`timeline_from_stamps` turns that table into times in nanoseconds from the first CTA's start. Cycle counts are
converted with the SM clock *of that launch*: each CTA stamps both its cycle counter and the global nanosecond timer
at its start and end, and the median of cycles / ns over the CTAs that ran at least 2 µs is the clock (the global
timer alone is too coarse for sub-microsecond events). Under a memory-bound load the H200 runs at 1.70-1.83 GHz,
not the 1.98 GHz that an idle spin kernel (`measure_clock_ghz`) sees: converting with the idle clock under-states
every duration by 8-14 %.

Get one with `mlalab.kernels.Decoder.stage1_timeline()` (GPU only); `CtaTimeline.summary()` answers "where does the
time go" (launch skew, time to the first tile, per-tile interval and its parts, epilogue, tail) and
`CtaTimeline.events()` is the long table that `mlalab.plots` draws. Stamping costs a few stores per tile, so the
timed numbers of `mlalab.timing` are taken without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["CtaTimeline", "timeline_from_stamps", "launch_clock_ghz", "measure_clock_ghz"]


@dataclass(frozen=True)
class CtaTimeline:
    """One stage-1 launch: per CTA, times in ns from the earliest CTA start (``start_ns.min() == 0``)."""

    kernel: str  # which stage 1 ran (`Decoder.ran`)
    clock_ghz: float  # the SM clock used to convert cycle stamps
    start_ns: np.ndarray  # (n_cu,)
    end_ns: np.ndarray  # (n_cu,) after the last output store was issued
    issued_ns: np.ndarray  # (n_cu,) the first TMAs in flight (after the plan header's round trip)
    tile_ready_ns: tuple[np.ndarray, ...]  # per CTA: when each of its tiles had arrived in shared memory
    qk_done_ns: tuple[np.ndarray, ...]  # per CTA and tile: scores done
    pv_issued_ns: tuple[np.ndarray, ...]  # per CTA and tile: softmax done and PV issued (the refill follows)
    work_done_ns: tuple[np.ndarray, ...]  # per CTA: when each of its works' outputs were stored
    pv_done_ns: np.ndarray  # (n_cu,) the last work's final PV completed (NaN: no work, or more tiles than stamped)
    lse_done_ns: np.ndarray  # (n_cu,) the last work's softmax sum reduced (then: normalise and store the output)
    clock_source: str = "launch"  # "launch": the launch's own stamps; "given": passed by the caller; "idle-spin":
    # `measure_clock_ghz` (no CTA ran long enough to calibrate on, `Decoder.stage1_timeline`); "recorded":
    # rebuilt from an events table (`from_events`), already in ns

    @classmethod
    def from_events(cls, events: object, *, kernel: str = "recorded") -> CtaTimeline:
        """Rebuild a timeline from its `events` table (a pandas DataFrame or a list of dicts with ``cta``, ``event``,
        ``index``, ``t_ns``, e.g. one shape of a recorded data/profiles/*_timeline.csv), so a recorded launch is
        summarised by the same code as a live one. One launch only: CTAs are the integers 0 .. max(cta), each with one
        start, issued and end event; (cta, event, index) is unique; a CTA's tile, qk_done and pv_issued events are
        numbered 0 .. n-1 with the same n, its work_done events 0 .. w-1."""
        import pandas as pd

        d = pd.DataFrame(events)
        if d.empty:
            raise ValueError("events is empty: no CTA to rebuild")
        missing = [c for c in ("cta", "event", "index", "t_ns") if c not in d.columns]
        if missing:
            raise ValueError(f"events lack columns {missing}")
        if not np.isfinite(d["t_ns"].to_numpy(dtype=np.float64)).all():
            raise ValueError("events: every t_ns must be a finite number")
        for col in ("cta", "index"):
            v = d[col].to_numpy()
            if not (np.issubdtype(v.dtype, np.integer) and (v >= 0).all()):
                raise ValueError(f"events: {col} must be integers >= 0")
        if d.duplicated(["cta", "event", "index"]).any():
            raise ValueError("events: a (cta, event, index) appears twice: more than one launch in the table?")
        n_cu = int(d["cta"].max()) + 1
        by = {e: g.sort_values("index") for e, g in d.groupby("event")}

        def one(event: str, fill: float | None) -> np.ndarray:
            out = np.full(n_cu, np.nan)
            g = by.get(event)
            if g is not None:
                out[g["cta"].to_numpy(dtype=np.int64)] = g["t_ns"].to_numpy(dtype=np.float64)
            if fill is None and np.isnan(out).any():
                raise ValueError(f"events: every CTA 0 .. {n_cu - 1} needs a {event!r} event")
            return out

        def per_cta(event: str) -> tuple[np.ndarray, ...]:
            g = by.get(event)
            if g is None:
                return tuple(np.zeros(0) for _ in range(n_cu))
            out = []
            for c in range(n_cu):
                h = g[g["cta"] == c]
                if not np.array_equal(h["index"].to_numpy(), np.arange(len(h))):
                    raise ValueError(f"events: CTA {c}'s {event!r} events must be numbered 0 .. {len(h) - 1}")
                out.append(h["t_ns"].to_numpy(dtype=np.float64))
            return tuple(out)

        tiles, qk, pv = per_cta("tile"), per_cta("qk_done"), per_cta("pv_issued")
        for c in range(n_cu):
            if not len(tiles[c]) == len(qk[c]) == len(pv[c]):
                raise ValueError(f"events: CTA {c} has {len(tiles[c])} tile, {len(qk[c])} qk_done and {len(pv[c])} "
                                 "pv_issued events: each tile needs all three")  # fmt: skip
        return cls(
            kernel=kernel, clock_ghz=float("nan"), start_ns=one("start", None), end_ns=one("end", None),
            issued_ns=one("issued", None), tile_ready_ns=tiles, qk_done_ns=qk, pv_issued_ns=pv,
            work_done_ns=per_cta("work_done"), pv_done_ns=one("pv_done", np.nan), lse_done_ns=one("lse_done", np.nan),
            clock_source="recorded",
        )  # fmt: skip

    @property
    def n_cu(self) -> int:
        return int(self.start_ns.shape[0])

    def summary(self) -> dict[str, float]:
        """Medians over the CTAs that had work (ns): where one launch's time goes."""
        busy = [c for c in range(self.n_cu) if len(self.tile_ready_ns[c])]
        if not busy:
            raise ValueError("no CTA streamed a tile: nothing to summarise")
        first = np.array([self.tile_ready_ns[c][0] - self.start_ns[c] for c in busy])
        gaps = np.concatenate([np.diff(self.tile_ready_ns[c]) for c in busy])
        last_tile_to_end = np.array([self.end_ns[c] - self.tile_ready_ns[c][-1] for c in busy])
        last_pv_to_end = np.array([self.end_ns[c] - self.pv_issued_ns[c][-1] for c in busy])
        pv_wait = np.array([self.pv_done_ns[c] - self.pv_issued_ns[c][-1] for c in busy])

        def median_or_nan(x: np.ndarray) -> float:  # (timelines recorded before the epilogue stamps have none)
            x = np.asarray(x, dtype=np.float64)
            return float(np.median(x[np.isfinite(x)])) if np.isfinite(x).any() else float("nan")

        return {
            "ctas_busy": float(len(busy)),
            "span_ns": float(self.end_ns.max() - self.start_ns.min()),
            "start_skew_ns": float(self.start_ns[busy].max() - self.start_ns[busy].min()),
            "header_ns": float(np.median(self.issued_ns[busy] - self.start_ns[busy])),
            "first_tile_ns": float(np.median(first)),
            "tile_interval_ns": float(np.median(gaps)) if gaps.size else float("nan"),
            "tile_qk_ns": float(np.median(np.concatenate([self.qk_done_ns[c] - self.tile_ready_ns[c] for c in busy]))),
            "tile_softmax_ns": float(
                np.median(np.concatenate([self.pv_issued_ns[c] - self.qk_done_ns[c] for c in busy]))
            ),
            "last_tile_to_end_ns": float(np.median(last_tile_to_end)),
            "epilogue_ns": float(np.median(last_pv_to_end)),  # last PV issued -> outputs stored (PV wait included)
            # its parts, for each CTA's last work: the PV's completion, the softmax sum, normalise + output stores
            "epilogue_pv_wait_ns": median_or_nan(pv_wait),
            "epilogue_sum_ns": median_or_nan(self.lse_done_ns[busy] - self.pv_done_ns[busy]),
            "epilogue_store_ns": median_or_nan(self.end_ns[busy] - self.lse_done_ns[busy]),
            "end_spread_ns": float(self.end_ns[busy].max() - self.end_ns[busy].min()),
        }

    def events(self) -> list[dict[str, float | int | str]]:
        """One row per event: ``cta``, ``event`` (start, issued, tile, qk_done, pv_issued, work_done, pv_done,
        lse_done, end; the last three once per CTA with work), ``index`` (the tile or work number), ``t_ns``."""
        rows: list[dict[str, float | int | str]] = []
        for c in range(self.n_cu):
            rows.append({"cta": c, "event": "start", "index": 0, "t_ns": float(self.start_ns[c])})
            rows.append({"cta": c, "event": "issued", "index": 0, "t_ns": float(self.issued_ns[c])})
            for event, times in (
                ("tile", self.tile_ready_ns[c]),
                ("qk_done", self.qk_done_ns[c]),
                ("pv_issued", self.pv_issued_ns[c]),
                ("work_done", self.work_done_ns[c]),
            ):
                rows += [{"cta": c, "event": event, "index": i, "t_ns": float(t)} for i, t in enumerate(times)]
            for event, t in (("pv_done", self.pv_done_ns[c]), ("lse_done", self.lse_done_ns[c])):
                if np.isfinite(t):
                    rows.append({"cta": c, "event": event, "index": 0, "t_ns": float(t)})
            rows.append({"cta": c, "event": "end", "index": 0, "t_ns": float(self.end_ns[c])})
        return rows


#: CTAs shorter than this (global timer, ns) are left out of the clock calibration: the timer ticks coarsely.
MIN_CALIBRATION_NS = 2000


def launch_clock_ghz(stamps: np.ndarray) -> float | None:
    """The SM clock (GHz) during one stamped launch: the median over CTAs that ran >= `MIN_CALIBRATION_NS` of their
    cycles / global-timer ns between start and end (columns 2, 3 and 0, 1); None when no CTA ran that long."""
    stamps = np.asarray(stamps, dtype=np.int64)
    if stamps.ndim != 2 or stamps.shape[1] < 4:
        raise ValueError(f"stamps must be a (n_cu, >= 4) table of the kernel's stamps, got shape {stamps.shape}")
    ns = (stamps[:, 1] - stamps[:, 0]).astype(np.float64)
    cycles = (stamps[:, 3] - stamps[:, 2]).astype(np.float64)
    if (ns < 0).any() or (cycles < 0).any():
        raise ValueError("a CTA ended before it started: the stamp table was not written by one complete launch")
    ok = ns >= MIN_CALIBRATION_NS
    return float(np.median(cycles[ok] / ns[ok])) if ok.any() else None


def timeline_from_stamps(
    stamps: np.ndarray, tiles_per_cta: np.ndarray, works_per_cta: np.ndarray, *, clock_ghz: float | None = None,
    kernel: str, max_events: int, clock_source: str = "given",
) -> CtaTimeline:  # fmt: skip
    """Convert the kernel's stamp table (n_cu, 8 + 4·max_events) int64 into a `CtaTimeline` (see the module doc).

    `clock_ghz` None (default): the launch's own clock (`launch_clock_ghz`); ValueError if no CTA ran long enough
    to calibrate it, then pass one (e.g. `measure_clock_ghz`). CTAs with more than `max_events` tiles or works keep
    their first `max_events` (the kernel stamps no more)."""
    stamps = np.asarray(stamps, dtype=np.int64)
    n_cu = int(stamps.shape[0]) if stamps.ndim == 2 else -1
    if stamps.ndim != 2 or stamps.shape[1] != 8 + 4 * max_events:
        raise ValueError(f"stamps must be (n_cu, {8 + 4 * max_events}) int64, got shape {tuple(stamps.shape)}")
    tiles_per_cta, works_per_cta = np.asarray(tiles_per_cta), np.asarray(works_per_cta)
    if tiles_per_cta.shape != (n_cu,) or works_per_cta.shape != (n_cu,):
        raise ValueError(f"tiles_per_cta and works_per_cta must have shape ({n_cu},)")
    if (stamps[:, 1] < stamps[:, 0]).any() or (stamps[:, 3] < stamps[:, 2]).any():
        raise ValueError("a CTA ended before it started: the stamp table was not written by one complete launch")
    if clock_source not in ("given", "idle-spin"):
        raise ValueError(f"clock_source of a passed clock must be 'given' or 'idle-spin', got {clock_source!r}")
    source = clock_source
    if clock_ghz is None:
        clock_ghz, source = launch_clock_ghz(stamps), "launch"
        if clock_ghz is None:
            raise ValueError(f"no CTA ran >= {MIN_CALIBRATION_NS} ns, too short to calibrate the SM clock on the "
                             "launch: pass clock_ghz (e.g. measure_clock_ghz())")  # fmt: skip
    if not np.isfinite(clock_ghz) or clock_ghz <= 0:
        raise ValueError(f"clock_ghz must be a positive number, got {clock_ghz}")
    t0 = int(stamps[:, 0].min())
    start = (stamps[:, 0] - t0).astype(np.float64)

    def at(c: int, cycles: np.ndarray) -> np.ndarray:  # SM cycle stamps of CTA c -> ns from t0
        return start[c] + (cycles.astype(np.float64) - float(stamps[c, 2])) / clock_ghz

    tiles, qk, pv, works = [], [], [], []
    for c in range(n_cu):
        nt, nw = min(int(tiles_per_cta[c]), max_events), min(int(works_per_cta[c]), max_events)
        for out, block, n in ((tiles, 0, nt), (qk, 1, nt), (pv, 2, nt), (works, 3, nw)):
            first = 8 + block * max_events
            out.append(at(c, stamps[c, first : first + n]))
    return CtaTimeline(
        kernel=kernel,
        clock_ghz=float(clock_ghz),
        start_ns=start,
        end_ns=np.array([at(c, stamps[c, 3:4])[0] for c in range(n_cu)]),
        issued_ns=np.array([at(c, stamps[c, 4:5])[0] for c in range(n_cu)]),
        tile_ready_ns=tuple(tiles),
        qk_done_ns=tuple(qk),
        pv_issued_ns=tuple(pv),
        work_done_ns=tuple(works),
        # paired with the last stamped PV issue: meaningless when the CTA streamed more tiles than were stamped
        pv_done_ns=np.array(
            [
                at(c, stamps[c, 5:6])[0] if works_per_cta[c] and tiles_per_cta[c] <= max_events else np.nan
                for c in range(n_cu)
            ]
        ),  # fmt: skip
        lse_done_ns=np.array([at(c, stamps[c, 6:7])[0] if works_per_cta[c] else np.nan for c in range(n_cu)]),
        clock_source=source,
    )


def measure_clock_ghz(device: torch.device | str = "cuda", spin_ns: int = 200_000) -> float:
    """The SM clock in GHz: one CTA spins `spin_ns` of global time and counts its cycles (GPU only)."""
    import triton
    import triton.language as tl

    if not torch.cuda.is_available():
        raise RuntimeError("measure_clock_ghz needs a CUDA GPU (torch.cuda.is_available() is False)")
    if spin_ns < 10_000:
        raise ValueError(f"spin_ns must be >= 10000 (the global timer may tick in microseconds), got {spin_ns}")

    @triton.jit
    def _spin(OUT, SPIN_NS: tl.constexpr):
        g0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        c0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        g = g0
        while g - g0 < SPIN_NS:
            g = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(OUT, g - g0)
        tl.store(OUT + 1, c - c0)

    out = torch.zeros(2, dtype=torch.int64, device=device)
    _spin[(1,)](out, SPIN_NS=spin_ns, num_warps=1)
    ns, cycles = (int(v) for v in out.cpu())
    return cycles / ns
