"""The in-memory fake cluster: scenario nodes, a simulated kubelet on the clock, fault injection.

The embedded default backend, used by `gpuyard demo`, simulations and users' test suites.
"""

from gpuyard.fakecluster.cluster import FakeCluster
from gpuyard.fakecluster.kubelet import ANNOTATION_DURATION, ANNOTATION_EXIT_CODE, ANNOTATION_START_DELAY
from gpuyard.fakecluster.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = [
    "ANNOTATION_DURATION",
    "ANNOTATION_EXIT_CODE",
    "ANNOTATION_START_DELAY",
    "FakeCluster",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
]
