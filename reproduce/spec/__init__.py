"""Resolving a run's config: composition of the Hydra groups and a preset's scale, the registries' defaults, each
numeric key's domain, and where every key's value came from (``python -m reproduce.describe``)."""
