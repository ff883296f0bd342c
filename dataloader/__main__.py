"""``python -m dataloader run|inspect|convert|demo``: see :mod:`dataloader.cli`."""

from absl import flags

import dataloader.cli

# absl's --help prints the main module's docstring and key flags: make them the CLI's.
__doc__ = dataloader.cli.__doc__
flags.adopt_module_key_flags(dataloader.cli)

if __name__ == "__main__":
    dataloader.cli.run()
