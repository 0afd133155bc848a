"""The scheduling cycle: one attempt per candidate (admit, place, preempt, hold), backfill behind
a held head, and the gangs whose schedule timeout ran out."""
