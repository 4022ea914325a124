"""`python -m piserini_ray.cli COMMAND`: the same as `piserini-ray COMMAND`."""

from piserini_ray.cli import entry

entry()
