"""``python -m padoc_ray.cli``: the ``padoc-ray`` command."""

import sys

from padoc_ray.cli import main

if __name__ == "__main__":  # engine processes are spawned: they import this module and must not run it
    sys.exit(main())
