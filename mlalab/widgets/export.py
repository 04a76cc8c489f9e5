"""What every panel shares: a visible busy state while it computes (`BusyIndicator`), and an export bar that saves
the panel's table as CSV and its figure(s) as HTML or PNG (`export_bar`), beside plain functions that do the saving
(`save_table`, `save_figure`) for scripts.

    from mlalab.widgets.export import BusyIndicator, export_bar
    busy = BusyIndicator()
    with busy("computing the sweep"):
        ...
    bar = export_bar("timings", table=lambda: df, figures=lambda: {"bars": fig})

Files go to ``exports/`` beside the notebook (atomic writes, `mlalab.io`); the bar names each file it wrote and
offers a download link for the small ones. PNG needs the optional ``kaleido`` package (and a Chrome/Chromium);
without it the bar says so and points at the camera button in the figure's own toolbar. `show_figure` puts a new
figure (layout included) into a panel's FigureWidget, or says in the figure that the selection has nothing to show.
"""

from __future__ import annotations

import base64
import html
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from ..io import atomic_write
from ..plots.palette import place_title

__all__ = [
    "BusyIndicator",
    "ExportBar",
    "export_bar",
    "save_table",
    "save_figure",
    "safe_stem",
    "show_figure",
    "EXPORT_DIR",
]

#: Where panels write their exports (relative to the working directory: the notebook's folder in JupyterLab).
EXPORT_DIR = Path("exports")
_LINK_LIMIT = 2_000_000  # bytes: larger files get no data: link, only their path


def safe_stem(text: str) -> str:
    """A file-name stem from free text (a run name, a shape): letters, digits, ``.-_`` only."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    if not s:
        raise ValueError(f"text must contain a letter or digit, got {text!r}")
    return s[:120]


def save_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write `df` as CSV (index kept only when it is named); the path must end in .csv."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    p = Path(path)
    if p.suffix.lower() != ".csv":
        raise ValueError(f"path must end in .csv, got {str(path)!r}")
    keep_index = any(n is not None for n in df.index.names)
    return atomic_write(p, lambda tmp: df.to_csv(tmp, index=keep_index))


def save_figure(fig: go.Figure, path: str | Path) -> Path:
    """Write `fig` as a self-contained HTML page (plotly.js inside, works offline) or a PNG (needs ``kaleido``),
    chosen by the suffix (.html or .png)."""
    if not isinstance(fig, go.Figure | go.FigureWidget):
        raise TypeError(f"fig must be a plotly Figure, got {type(fig).__name__}")
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".html", ".png"):
        raise ValueError(f"path must end in .html or .png, got {str(path)!r}")
    plain = go.Figure(fig)  # a FigureWidget's plain copy: no comm needed to render it
    if suffix == ".html":
        return atomic_write(p, lambda tmp: plain.write_html(tmp, include_plotlyjs=True, full_html=True))
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "PNG export needs the optional package kaleido (pip install kaleido) and a Chrome/Chromium; "
            "the camera button in the figure's toolbar saves a PNG from the browser without it"
        ) from None
    return atomic_write(p, lambda tmp: plain.write_image(tmp, format="png", scale=2))


_SPINNER = (
    "<span style='display:inline-flex;align-items:center;gap:6px;color:#555'>"
    "<span style='width:12px;height:12px;border:2px solid #bbb;border-top-color:#1f77b4;border-radius:50%;"
    "display:inline-block;animation:mlalab-spin 0.8s linear infinite'></span>{text}</span>"
    "<style>@keyframes mlalab-spin{{to{{transform:rotate(360deg)}}}}</style>"
)


@dataclass
class BusyIndicator:
    """An HTML line that reads "computing …" (with a spinner) while a panel works and "updated in N s" after.

    ``with busy("what"):`` around the work; the widget is ``busy.widget``; ``busy.busy`` is True inside."""

    widget: W.HTML = field(default_factory=lambda: W.HTML(layout=W.Layout(min_height="22px")))
    busy: bool = False
    last_seconds: float | None = None

    @contextmanager
    def __call__(self, what: str = "computing") -> Iterator[None]:
        if not isinstance(what, str):
            raise TypeError(f"what must be a str, got {type(what).__name__}")
        self.busy = True
        self.widget.value = _SPINNER.format(text=html.escape(f"{what} …"))
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.busy = False
            self.last_seconds = time.perf_counter() - t0
            self.widget.value = f"<span style='color:#777;font-size:90%'>updated in {self.last_seconds:.2f} s</span>"


@dataclass
class ExportBar:
    """Buttons that save the panel's table (CSV) and figures (HTML, PNG), and a line naming what was written."""

    box: W.HBox
    csv: W.Button
    html: W.Button
    png: W.Button
    status: W.HTML
    stem: Callable[[], str]
    table: Callable[[], pd.DataFrame | None] | None
    figures: Callable[[], Mapping[str, go.Figure]] | None
    folder: Path

    def _done(self, paths: list[Path]) -> None:
        parts = []
        for p in paths:
            size = p.stat().st_size
            name = html.escape(p.name)
            if size <= _LINK_LIMIT:
                mime = {".csv": "text/csv", ".png": "image/png"}.get(p.suffix, "text/html")
                data = base64.b64encode(p.read_bytes()).decode()
                parts.append(f"<a download='{name}' href='data:{mime};base64,{data}'>{name}</a>")
            else:
                parts.append(name)
        self.status.value = f"saved to {html.escape(str(self.folder))}/: " + ", ".join(parts)

    def _fail(self, e: Exception) -> None:
        self.status.value = f"<span style='color:#b00'>⚠ {html.escape(str(e))}</span>"

    def save_csv(self, *_: object) -> Path | None:
        """Write the panel's table; None (and a message) when it shows none."""
        df = self.table() if self.table else None
        if df is None or len(df) == 0:
            self.status.value = "<i>this view has no table to export</i>"
            return None
        try:
            p = save_table(df, self.folder / f"{safe_stem(self.stem())}.csv")
        except (OSError, ValueError, TypeError) as e:
            self._fail(e)
            return None
        self._done([p])
        return p

    def save_figures(self, suffix: str) -> list[Path]:
        """Write every figure the panel shows as `suffix` ("html" or "png")."""
        if suffix not in ("html", "png"):
            raise ValueError(f"suffix must be 'html' or 'png', got {suffix!r}")
        figs = {k: f for k, f in (self.figures() if self.figures else {}).items() if f is not None and len(f.data)}
        if not figs:
            self.status.value = "<i>this view has no figure to export</i>"
            return []
        paths = []
        try:
            for key, fig in figs.items():
                paths.append(save_figure(fig, self.folder / f"{safe_stem(self.stem())}_{safe_stem(key)}.{suffix}"))
        except (OSError, ValueError, TypeError, RuntimeError) as e:
            self._fail(e)
            return paths
        self._done(paths)
        return paths


def export_bar(
    stem: str | Callable[[], str],
    *,
    table: Callable[[], pd.DataFrame | None] | None = None,
    figures: Callable[[], Mapping[str, go.Figure]] | None = None,
    folder: str | Path = EXPORT_DIR,
) -> ExportBar:
    """An `ExportBar` for a panel: `stem` names the files (a str, or a function of what is shown now), `table`
    returns the DataFrame the panel shows (None: no CSV button), `figures` returns ``{name: figure}`` (None: no
    figure buttons)."""
    if table is None and figures is None:
        raise ValueError("export_bar needs a table or figures to export")
    for name, f in (("table", table), ("figures", figures)):
        if f is not None and not callable(f):
            raise TypeError(f"{name} must be a function returning what the panel shows, got {type(f).__name__}")
    if isinstance(stem, str):
        safe_stem(stem)  # fail now on an unusable name
        get_stem: Callable[[], str] = lambda: stem  # noqa: E731
    elif callable(stem):
        get_stem = stem
    else:
        raise TypeError(f"stem must be a str or a function returning one, got {type(stem).__name__}")
    small = W.Layout(width="auto")
    csv = W.Button(description="table CSV", icon="download", layout=small, tooltip="save the table as CSV")
    htm = W.Button(description="figure HTML", icon="download", layout=small, tooltip="interactive, works offline")
    png = W.Button(description="figure PNG", icon="download", layout=small, tooltip="needs kaleido")
    status = W.HTML(layout=W.Layout(flex="1 1 auto", overflow="hidden"))
    buttons = ([csv] if table else []) + ([htm, png] if figures else [])
    box = W.HBox([*buttons, status], layout=W.Layout(flex_flow="row wrap", align_items="center"))
    box.add_class("mlalab-export")
    bar = ExportBar(box, csv, htm, png, status, get_stem, table, figures, Path(folder))
    csv.on_click(bar.save_csv)
    htm.on_click(lambda *_: bar.save_figures("html"))
    png.on_click(lambda *_: bar.save_figures("png"))
    return bar


def show_figure(fw: go.FigureWidget, fig: go.Figure | None, empty: str = "nothing to show for this selection") -> None:
    """Put `fig` (traces AND layout: titles, axis titles, legend) into the panel's FigureWidget; None clears the
    traces and titles the figure with `empty`, so a figure never keeps the title of what it showed before."""
    if not isinstance(fw, go.FigureWidget):
        raise TypeError(f"fw must be a plotly FigureWidget, got {type(fw).__name__}")
    if fig is None:
        fig = go.Figure(layout={"title": {"text": empty}, "height": 160, "xaxis": {"visible": False},
                                "yaxis": {"visible": False}})  # fmt: skip
    fig = place_title(go.Figure(fig))
    with fw.batch_update():
        fw.data = ()
        fw.layout = go.Layout()  # drop what the previous figure set and the new one does not
        fw.add_traces(list(fig.data))
        fw.layout = fig.layout
