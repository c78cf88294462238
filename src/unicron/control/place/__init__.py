"""Placement: the planner's answer carried out, hot spares, measured throughput, what each step changes."""
