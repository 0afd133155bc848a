"""What `gpuyard simulate` says about its PNG plots: they need matplotlib, the `plot` extra, which
neither the package's own dependencies nor a checkout's `make run` / `make test` install."""

from __future__ import annotations

__all__ = ["HOW_TO_PLOT", "no_plot_line", "out_help"]

HOW_TO_PLOT = "pip install 'gpuyard[plot]'; in a gpuyard checkout: make plot"


def out_help(files: str, png: str) -> str:
    """The `--out` option's help: the files always written, and the plot only with matplotlib."""
    return f"Directory for {files}; also {png} where matplotlib is installed ({HOW_TO_PLOT})."


def no_plot_line(png: str) -> str:
    """The line printed instead of `wrote PNG` when matplotlib is missing."""
    return f"no {png}: matplotlib is not installed (for plots: {HOW_TO_PLOT})"
