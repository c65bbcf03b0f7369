"""fedtune ClientApp: answer the start-up query and train the sub-network each round."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    from fedtune_app.apps.client import handle_query  # imported on first use: keeps start-up light

    return handle_query(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    from fedtune_app.apps.client import handle_train

    return handle_train(msg, context)
