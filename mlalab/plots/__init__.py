"""Plotly figure builders (one submodule per topic); every builder returns a ``go.Figure`` and takes plain
data (tensors, DataFrames, WorkPlans), so notebooks, widgets and the HTML report share them."""
