"""The scheduler's cluster cache: its copy of the watched objects, the NumPy snapshot of free
capacity (node rows, arrays, masks, the allocation ledger), what it has assumed before the store
confirms it, room held for waiting gangs, and gang groups."""
