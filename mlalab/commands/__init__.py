"""CLI subcommands; one module each (see ``mlalab/__main__.py``)."""
