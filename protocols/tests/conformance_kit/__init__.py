"""Tests of the conformance kit (a package, so its helper modules import relatively)."""
