"""pytest plugin of the tempering conformance kit (work in progress)."""
