"""Trace-driven simulation of Unicron and baseline policies on a multi-task cluster."""
