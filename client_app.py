"""fedtune ClientApp, as pyproject names it (``clientapp = "client_app:app"``); the app itself
lives in ``fedtune_app.apps.client_app``."""

from fedtune_app.apps.client_app import app

__all__ = ["app"]  # Flower finds the app by reading this file, not by importing it
