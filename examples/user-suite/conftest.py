"""Load gpuyard's pytest plugin (harmless when gpuyard's entry point already loads it)."""

pytest_plugins = ["gpuyard.testing"]
