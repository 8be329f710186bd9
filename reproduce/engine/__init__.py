"""The training engine of one run: the trainer and its stages, the tasks (LM, translation), the optimiser, checkpoints
and resume, DDP, progress lines and the loggers."""
