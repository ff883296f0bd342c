"""``python -m dataloader run|inspect|convert|demo|audit|index``: see :mod:`dataloader.cli.main`."""

from absl import flags

import dataloader.cli.main

# absl's --help prints the main module's docstring and key flags: make them the CLI's.
__doc__ = dataloader.cli.main.__doc__
flags.adopt_module_key_flags(dataloader.cli.main)

if __name__ == "__main__":
    dataloader.cli.main.run()
