"""The defragmenting rescheduler: its inputs from the core, its plans, and the decisions it takes."""
