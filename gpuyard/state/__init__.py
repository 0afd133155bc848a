"""The ground floor: the object store (the cache of what the backend holds), its journal, the
work queues that feed reconcilers, clocks, settings, and the seams every component is built with
(the backend protocol and the async writer). Imports nothing of gpuyard above `apis`."""
