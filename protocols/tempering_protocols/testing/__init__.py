"""Conformance kit for the tempering protocols (work in progress)."""
