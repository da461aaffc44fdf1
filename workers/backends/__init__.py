"""Backends that serve a member call: simulated in real time, or (later) HTTP models."""
