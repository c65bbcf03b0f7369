"""fedtune ServerApp: read the run config, run the chosen method, write the results folder."""

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedtune_app.apps.server import run_federation
from fedtune_app.config import describe_settings, settings_origins, setup_logging
from fedtune_app.data.splits import describe_data
from fedtune_app.methods import resolve_config

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    setup_logging()
    cfg = resolve_config(context.run_config)  # bad config stops here, before any training
    log = logging.getLogger("fedtune")
    origins = settings_origins(context.run_config)
    log.info(describe_settings(origins))
    log.info(describe_data(cfg.data, origins))
    folder = run_federation(grid, cfg)
    print(f"RESULTS {folder}", flush=True)
