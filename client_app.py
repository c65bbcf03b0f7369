"""fedtune ClientApp, as pyproject names it (``clientapp = "client_app:app"``); the app itself
lives in ``fedtune_app.apps.client_app``."""

from fedtune_app.apps.client_app import app  # noqa: F401
