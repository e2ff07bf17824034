"""Running compute beside communication: footprint measurement (more arrives with the overlap issue)."""
