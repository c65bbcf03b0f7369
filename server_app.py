"""fedtune ServerApp, as pyproject names it (``serverapp = "server_app:app"``); the app itself
lives in ``fedtune_app.apps.server_app``."""

from fedtune_app.apps.server_app import app

__all__ = ["app"]  # Flower finds the app by reading this file, not by importing it
