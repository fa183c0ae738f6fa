"""Data of the default encoder (`gemkernels.compress.encoders.static`): the static table distilled from
all-MiniLM-L6-v2, its tokenizer, NOTICE and licence (Apache-2.0); rebuilt by ``python -m
gemkernels.compress.encoders.distill``."""
