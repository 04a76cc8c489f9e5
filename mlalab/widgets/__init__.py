"""ipywidgets panels: controls -> library -> plotly FigureWidgets (one submodule per notebook topic).

Panels catch invalid combinations and show the message inside the panel, never a traceback."""
