"""Compiling ``MapDataset`` chains onto the engine: the node tree, index maps, mixing
schedules, and the wrappers that restrict operations to parts of a mixture."""
