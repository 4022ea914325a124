"""`python -m piserini_ray.cli COMMAND`: the same as `piserini-ray COMMAND`."""

import sys

from piserini_ray.cli import main

sys.exit(main())
