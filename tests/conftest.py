import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from fedtune_app.model.backbones import ModelSpec

TINY_VIT = ModelSpec("vit_tiny_patch16_224", "random",
                     "img_size=8,patch_size=2,in_chans=1,embed_dim=32,depth=4,num_heads=2", 3, 10)
TINY_MIXER = ModelSpec("mixer_s16_224", "random",
                       "img_size=8,patch_size=2,in_chans=1,embed_dim=32,num_blocks=4", 3, 10)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """A 3-layer BERT config (random init) saved as a local Hugging Face directory."""
    from transformers import BertConfig

    path = tmp_path_factory.mktemp("tiny-bert")
    BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=32).save_pretrained(path)
    return str(path)
