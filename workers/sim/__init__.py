"""Simulated candidates, network and workflow: the whole system in virtual time."""
