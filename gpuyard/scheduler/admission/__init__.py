"""Admission: tenant queues, the elastic quota tree and its fair-share order, what a job's
admission status says (records), and the jobs parked on quota alone."""
