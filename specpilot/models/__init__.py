"""Dense Llama/Qwen3 decoders: config, forward pass, HF loading/saving, tokenizer, test checkpoints,
and the projection modules the engine swaps in (`linear.py`: Triton kernels, `w12_linear.py`: W12
weights) with W12 checkpoint conversion (`convert.py`)."""
