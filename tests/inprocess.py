"""The in-process Grid lives in the library (notebooks and the comparison command use it)."""

from fedtune_app.apps.inprocess import Fault, InProcessGrid, simulation_nodes  # noqa: F401
