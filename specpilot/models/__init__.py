"""Dense Llama/Qwen3 decoders: config, forward pass, HF loading/saving, tokenizer, test checkpoints."""
