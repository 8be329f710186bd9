"""A run's settings, resolved once (``resolve.resolve`` -> a frozen ``RunSpec``): the config schema and the
composition of the Hydra groups with a preset's sections and scale, each numeric key's domain, and where every key's
value came from (``repdegen describe ... sources=true``)."""
