"""Placement: the pure `place(snapshot, gang, profile)` and its framework — filters, scores, GPU
choosers, topology plugins, packing policies, profiles and the plugin registry."""
