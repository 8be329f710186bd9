"""A run's settings, resolved once (``resolve.resolve`` -> a frozen ``RunSpec``): the config schema and the one
composition of the Hydra groups (a preset's files for the objective and the scale among them), each numeric key's
domain, and where every key's value came from (``repdegen describe ... sources=true``)."""
