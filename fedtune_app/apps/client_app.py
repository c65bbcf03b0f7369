"""fedtune ClientApp: answer the start-up query and train the sub-network each round.

With a node worker configured (node config ``worker-address``; ``fedtune node-worker``), each
message is handed to that long-lived process, which keeps torch, the model and the data warm;
otherwise, or when it cannot be reached, the message is handled here."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    from fedtune_app.apps.node_worker import delegate  # light: no torch

    reply = delegate("query", msg, context)
    if reply is not None:
        return reply
    from fedtune_app.apps.client import handle_query  # imported on first use: keeps start-up light

    return handle_query(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    from fedtune_app.apps.node_worker import delegate

    reply = delegate("train", msg, context)
    if reply is not None:
        return reply
    from fedtune_app.apps.client import handle_train

    return handle_train(msg, context)
