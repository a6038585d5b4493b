"""Hugging Face DeepSeek-V3 / Kimi-K2 checkpoints <-> our variables.

config_map (config.json <-> ModelConfig), names (tensor name / layout mapping),
quant (block fp8, packed int4), reader (streaming safetensors), importer (`load_hf`,
`import_to_checkpoint`), checkpoint (our orbax format), writer (`export_hf`).
"""
