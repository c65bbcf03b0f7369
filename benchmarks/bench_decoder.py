"""Per-step training cost on the CPU of a tiny decoder (Llama) vs an encoder (BERT) of the same
size, both random-init, LoRA on every block's last FC, the client's real path (``train_local`` on
the full plan), the same tokenised batches (MiniLM's tokenizer), in one run.

Two decoders: the same shape as the encoder (hidden, layers, heads, FFN width: the SwiGLU MLP
then has 3 matrices instead of 2) and the same parameter count (FFN width 2/3 of the encoder's).

    python benchmarks/bench_decoder.py --threads 1
    python benchmarks/bench_decoder.py --hidden 256 --layers 4 --length 128 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch  # noqa: E402

from common import save, table
from fedtune_app.config import RunConfig, app_defaults  # noqa: E402
from fedtune_app.data.splits import Examples  # noqa: E402
from fedtune_app.methods import recipe_for, resolve_config  # noqa: E402
from fedtune_app.model.adapters import trainable_parameters  # noqa: E402
from fedtune_app.model.backbones import MINILM, ModelSpec, hf_model_path, tokenizer_for  # noqa
from fedtune_app.training.local import train_local  # noqa: E402


def save_models(root: Path, hidden: int, layers: int, heads: int, ffn: int) -> dict[str, str]:
    from transformers import BertConfig, LlamaConfig

    tokenizer = tokenizer_for(ModelSpec(MINILM))
    common = dict(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, max_position_embeddings=512,
                  pad_token_id=tokenizer.pad_token_id)
    configs = {"encoder (BERT)": BertConfig(intermediate_size=ffn, **common),
               "decoder (Llama), same shape": LlamaConfig(intermediate_size=ffn,
                                                          num_key_value_heads=heads, **common),
               "decoder (Llama), same parameters": LlamaConfig(
                   intermediate_size=2 * ffn // 3, num_key_value_heads=heads, **common)}
    dirs = {}
    for i, (name, config) in enumerate(configs.items()):
        path = root / str(i)
        config.save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs[name] = str(path)
    return dirs


def step_seconds(cfg: RunConfig, data: Examples, steps: int,
                 repeats: int) -> tuple[float, int, int]:
    recipe = recipe_for(cfg)
    model = recipe.build(ModelSpec.from_config(cfg.model, 2))
    params = list(trainable_parameters(model).values())
    times = []
    for rep in range(repeats + 1):  # the first pass warms up
        started = time.perf_counter()
        train_local(model, params, data, cfg.training, seed=rep, device=torch.device("cpu"))
        times.append((time.perf_counter() - started) / steps)
    block = sum(p.numel() for p in model.blocks[0].parameters() if not p.requires_grad)
    return statistics.median(times[1:]), block, sum(p.numel() for p in params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=64, help="tokens per example")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="training steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    words = Path(hf_model_path(ModelSpec(MINILM)), "vocab.txt").read_text().split()[2000:7000]
    texts = [" ".join(words[i] for i in torch.randint(len(words), (args.length,), generator=gen))
             for _ in range(args.steps * args.batch_size)]
    labels = torch.randint(2, (len(texts),), generator=gen)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = save_models(Path(tmp), args.hidden, args.layers, args.heads, 4 * args.hidden)
        for name, path in dirs.items():
            cfg = resolve_config({**app_defaults(), "model": path, "model-source": "random",
                                  "batch-size": args.batch_size, "capacities": "1"})
            enc = tokenizer_for(ModelSpec(path, "random"))(
                texts, padding="max_length", truncation=True, max_length=args.length,
                return_tensors="pt")
            data = Examples({"input_ids": enc["input_ids"],
                             "attention_mask": enc["attention_mask"]}, labels)
            seconds, block, trained = step_seconds(cfg, data, args.steps, args.repeats)
            rows.append({"model": name, "frozen params per block": block,
                         "trained params": trained, "step s": seconds})
    for r in rows:
        r["vs encoder"] = r["step s"] / rows[0]["step s"]
    text = table(f"Training step on the CPU ({torch.get_num_threads()} threads), hidden "
                 f"{args.hidden}, {args.layers} layers, {args.heads} heads, batch "
                 f"{args.batch_size} x {args.length} tokens, LoRA r=8 on the last FC", rows)
    name = "decoder" + (f"-{args.threads}thread" if args.threads else "")
    print(f"\nwrote {save(name, {'args': vars(args), 'rows': rows, 'table': text})}")


if __name__ == "__main__":
    main()
