"""The command line: ``python -m dataloader run|inspect|convert|demo`` (see :mod:`.main`)."""
