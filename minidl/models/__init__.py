"""Complete models built from minidl's layers, each in one readable file.

- :mod:`minidl.models.gpt`: a small GPT (decoder-only transformer), ``GPT`` and ``GPTConfig``;
- :mod:`minidl.models.gpt_train`: its training recipe and saved runs (``minidl gpt train``);
- the ``minidl gpt`` command is :mod:`minidl.cli.gpt`;
- :mod:`minidl.models.zoo`: pretrained weights that ship with minidl (``zoo.pretrained("digits-0-4-mlp")``).
"""
from minidl.models.gpt import GPT, GPTConfig, composed_attention

__all__ = ["GPT", "GPTConfig", "composed_attention"]
