"""`python -m gpuyard.cli` runs the command line."""

from gpuyard.cli import main

main()
