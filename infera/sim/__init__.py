"""The fleet simulator: the real router and policies against the mock engine's classes, in virtual time."""
